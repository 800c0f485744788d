"""`cronlock status --watch`: list then watch, 410 Gone, failures, and when it redraws."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from cronlock_operator.kube.errors import Expired, Forbidden, Unreachable
from cronlock_operator.status import api
from cronlock_operator.status import cli as status
from cronlock_operator.status.model import Change, Kind, Mirror
from tests.unit.status.objects import cronjob, lease


class Stop(Exception):
    """Ends `follow`, which otherwise runs for as long as the process."""


def versioned(obj: dict[str, Any], version: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = version
    return obj


@dataclass
class ScriptedSource:
    """A Source whose lists and watches answer from a script, in order: a Listing or an
    exception for each list, a list of events or an exception for each watch."""

    kind: Kind
    lists: list[api.Listing | Exception]
    watches: list[list[dict[str, Any]] | Exception]
    watched_from: list[str] = field(default_factory=list)

    def list(self) -> api.Listing:
        if not self.lists:
            raise Stop
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch(self, resource_version: str) -> Iterator[dict[str, Any]]:
        if not self.watches:
            raise Stop
        self.watched_from.append(resource_version)
        answer = self.watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return iter(answer)


def follow(source: ScriptedSource) -> tuple[list[Change], list[float]]:
    reported: list[Change] = []
    pauses: list[float] = []
    with pytest.raises(Stop):
        api.follow(source, reported.append, pauses.append)
    return reported, pauses


def test_follow_lists_once_then_watches_from_each_last_version() -> None:
    report = versioned(lease("report", holder="report-1-aaaaa_0001"), "11")
    released = versioned(lease("report"), "12")
    source = ScriptedSource(
        "leases",
        lists=[api.Listing([report], "10")],
        watches=[
            [{"type": "MODIFIED", "object": released}],
            # Bookmarks only move the version on.
            [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}],
            [],
        ],
    )

    reported, pauses = follow(source)

    assert [(change.type, change.objects) for change in reported] == [
        ("LISTED", (report,)),
        ("WATCHING", ()),
        ("MODIFIED", (released,)),
        ("WATCHING", ()),
        ("WATCHING", ()),
    ]
    assert source.watched_from == ["10", "12", "15"]
    assert pauses == []


def test_follow_lists_again_when_the_version_is_gone() -> None:
    first = versioned(cronjob("report"), "3")
    second = versioned(cronjob("export"), "40")
    source = ScriptedSource(
        "cronjobs",
        lists=[api.Listing([first], "5"), api.Listing([second], "40")],
        watches=[Expired("too old resource version: 5 (38)", status=410), []],
    )

    reported, pauses = follow(source)

    assert [change.type for change in reported] == ["LISTED", "LISTED", "WATCHING"]
    assert reported[1].objects == (second,)
    assert source.watched_from == ["5", "40"]
    assert pauses == []


def test_a_list_whose_pages_kept_expiring_is_a_failure_reported_and_waited_for() -> None:
    expiring = Expired("cannot list leases: its pages kept expiring (410 Gone)", status=410)
    source = ScriptedSource("leases", lists=[expiring, api.Listing([], "8")], watches=[[]])

    reported, pauses = follow(source)

    assert [(change.type, change.error) for change in reported] == [
        ("FAILED", str(expiring)),
        ("LISTED", ""),
        ("WATCHING", ""),
    ]
    assert pauses == [api.RETRY_SECONDS]


def test_follow_reports_a_failure_waits_and_carries_on_from_where_it_was() -> None:
    refused = Forbidden(
        "cannot watch leases.coordination.k8s.io in namespace a: forbidden", status=403
    )
    source = ScriptedSource(
        "leases",
        lists=[Unreachable("cannot list leases: unreachable"), api.Listing([], "8")],
        watches=[refused, []],
    )

    reported, pauses = follow(source)

    assert [(change.type, change.error) for change in reported] == [
        ("FAILED", "cannot list leases: unreachable"),
        ("LISTED", ""),
        ("FAILED", str(refused)),
        ("WATCHING", ""),
    ]
    # Listed once the list worked; the failed watch is retried from the same version.
    assert source.watched_from == ["8", "8"]
    assert pauses == [api.RETRY_SECONDS, api.RETRY_SECONDS]


def test_the_mirror_keeps_what_the_list_and_the_events_say() -> None:
    mirror = Mirror()
    report, export = cronjob("report"), cronjob("export")

    assert mirror.apply(Change("cronjobs", "LISTED", (report, export)))
    assert not mirror.ready
    assert mirror.apply(Change("leases", "LISTED", ()))
    assert mirror.ready
    assert mirror.apply(Change("cronjobs", "DELETED", (export,)))
    assert mirror.apply(Change("leases", "ADDED", (lease("report", holder="h"),)))
    assert [item["metadata"]["name"] for item in mirror.cronjobs()] == ["report"]
    assert [item["metadata"]["name"] for item in mirror.leases()] == ["cronlock-report"]


def test_the_mirror_shows_a_failure_until_that_kind_works_again() -> None:
    mirror = Mirror()
    mirror.apply(Change("cronjobs", "LISTED", ()))
    mirror.apply(Change("leases", "LISTED", ()))

    assert mirror.apply(Change("leases", "FAILED", error="leases: refused"))
    assert not mirror.apply(Change("leases", "FAILED", error="leases: refused"))
    assert mirror.apply(Change("cronjobs", "FAILED", error="cronjobs: refused"))
    assert mirror.failure == "cronjobs: refused"
    assert mirror.apply(Change("cronjobs", "WATCHING"))
    assert mirror.failure == "leases: refused"
    assert mirror.apply(Change("leases", "WATCHING"))
    assert mirror.failure is None
    assert not mirror.apply(Change("leases", "WATCHING"))


@dataclass
class Timeline:
    """Changes that arrive at given moments, a clock that only moves while waiting for
    them, and the moments the table was drawn; Ctrl-C once the clock passes `end`."""

    arrivals: list[tuple[float, Change]]
    end: float
    now: float = 0.0
    draws: list[tuple[float, list[str], str | None]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def next_change(self, timeout: float) -> Change | None:
        if self.arrivals and self.arrivals[0][0] <= self.now + timeout:
            at, change = self.arrivals.pop(0)
            self.now = max(self.now, at)
            return change
        self.now += timeout
        if self.now > self.end:
            raise KeyboardInterrupt
        return None

    def draw(self, mirror: Mirror) -> None:
        names = sorted(item["metadata"]["name"] for item in mirror.leases())
        self.draws.append((round(self.now, 3), names, mirror.failure))

    def run(self) -> None:
        with pytest.raises(KeyboardInterrupt):
            status._redraw(self.next_change, self.draw, self.clock)


def leases_listed(*names: str) -> Change:
    return Change("leases", "LISTED", tuple(lease(name) for name in names))


CRONJOBS_LISTED = Change("cronjobs", "LISTED", (cronjob("a"),))


def test_the_first_draw_waits_for_both_lists_then_it_redraws_every_2s() -> None:
    timeline = Timeline([(0.2, CRONJOBS_LISTED), (0.5, leases_listed("a"))], end=4.6)

    timeline.run()

    assert timeline.draws == [
        (0.5, ["cronlock-a"], None),
        (2.5, ["cronlock-a"], None),
        (4.5, ["cronlock-a"], None),
    ]


def test_a_burst_of_events_is_one_redraw_a_second_after_the_last_one() -> None:
    timeline = Timeline(
        [
            (0.0, CRONJOBS_LISTED),
            (0.0, leases_listed()),
            (0.1, Change("leases", "ADDED", (lease("a"),))),
            (0.2, Change("leases", "ADDED", (lease("b"),))),
            (0.4, Change("leases", "ADDED", (lease("c"),))),
            (1.7, Change("leases", "DELETED", (lease("a"),))),
        ],
        end=3.5,
    )

    timeline.run()

    assert timeline.draws == [
        (0.0, [], None),
        (1.0, ["cronlock-a", "cronlock-b", "cronlock-c"], None),
        # Drawn at once: more than a second after the last redraw.
        (2.0, ["cronlock-b", "cronlock-c"], None),
    ]


def test_a_failure_is_drawn_in_place_of_the_table_until_the_watch_is_back() -> None:
    timeline = Timeline(
        [
            (0.0, Change("cronjobs", "FAILED", error="cronjobs: refused")),
            (1.5, CRONJOBS_LISTED),
            (1.5, leases_listed("a")),
        ],
        end=3.0,
    )

    timeline.run()

    assert timeline.draws == [
        (0.0, [], "cronjobs: refused"),
        (1.5, ["cronlock-a"], None),
    ]


def mirrored(*changes: Change) -> Mirror:
    mirror = Mirror()
    for change in changes:
        mirror.apply(change)
    return mirror


def test_a_redraw_has_a_header_and_the_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    screen = status._Screen("default", status.View("table"), "cronlock")

    screen.draw(
        mirrored(
            Change("cronjobs", "LISTED", (cronjob("report"),)),
            Change("leases", "LISTED", (lease("report", holder="report-1-aaaaa_0001"),)),
        )
    )

    out = capsys.readouterr().out
    assert out.startswith("Every 2s: ")
    header, _, table = out.partition("\n\n")
    assert header.endswith(" UTC")
    assert table.splitlines()[1].split()[:3] == ["report", "report", "report-1-aaaaa_0001"]


def test_a_failure_replaces_the_table_and_in_json_goes_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failing = mirrored(Change("leases", "FAILED", error="cannot watch leases: forbidden"))

    status._Screen("default", status.View("table"), "cronlock").draw(failing)
    table = capsys.readouterr()
    status._Screen("default", status.View("json"), "cronlock").draw(failing)
    json_lines = capsys.readouterr()

    assert table.out.endswith("\n\ncronlock: cannot watch leases: forbidden\n")
    assert json_lines.out == ""
    assert json_lines.err == "cronlock: cannot watch leases: forbidden\n"


def test_json_redraws_are_one_list_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    screen = status._Screen("default", status.View("json"), "cronlock")
    mirror = mirrored(Change("cronjobs", "LISTED", (cronjob("report"),)), leases_listed())

    screen.draw(mirror)
    screen.draw(mirror)

    lines = capsys.readouterr().out.splitlines()
    assert [[item["cronjob"] for item in json.loads(line)["items"]] for line in lines] == [
        ["report"],
        ["report"],
    ]
