"""The line a full server's newcomers wait in (cronlock_sidecar.waitline): who leaves it
first, who is let in first, and how long one may wait."""

from __future__ import annotations

from typing import NamedTuple

from cronlock_sidecar import waitline
from cronlock_sidecar.waitline import WaitLine


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def line(length: int = 2, timeout: float = 2.0) -> tuple[WaitLine[str], Clock]:
    clock = Clock()
    return WaitLine(length, timeout, clock), clock


def test_a_full_line_gives_up_the_busiest_peers_newest_even_when_it_came_first() -> None:
    waiting, clock = line(length=2)
    for _ in range(5):  # a pod reconnecting in a loop
        waiting.arrived("loud")
    waiting.arrived("kubelet")
    assert waiting.join("loud-1", "loud", {}) is None
    clock.now += 0.1
    assert waiting.join("loud-2", "loud", {}) is None
    clock.now += 0.1
    # The kubelet came last, but the loud peer has two in line and connects more.
    assert waiting.join("probe", "kubelet", {}) == "loud-2"
    assert len(waiting) == 2


def test_as_busy_in_line_the_peer_that_connects_more_loses_its_place() -> None:
    waiting, _ = line(length=1)
    for _ in range(4):
        waiting.arrived("loud")
    waiting.arrived("kubelet")
    assert waiting.join("loud-1", "loud", {}) is None
    assert waiting.join("probe", "kubelet", {}) == "loud-1"


def test_what_a_peer_holds_counts_toward_how_busy_it_is() -> None:
    waiting, _ = line(length=1)
    waiting.arrived("a")
    waiting.arrived("b")
    assert waiting.join("a-1", "a", {"b": 3}) is None
    # b holds 3 connections already: its newcomer is the one to go.
    assert waiting.join("b-1", "b", {"b": 3}) == "b-1"


def test_a_freed_slot_goes_to_the_least_busy_peers_oldest() -> None:
    waiting, clock = line(length=4)
    for peer, item in (("loud", "loud-1"), ("quiet", "quiet-1"), ("loud", "loud-2")):
        waiting.arrived(peer)
        waiting.join(item, peer, {})
        clock.now += 0.1
    waiting.arrived("loud")
    assert waiting.next({}) == ("quiet-1", "quiet")
    assert waiting.next({}) == ("loud-1", "loud")  # then the oldest of the rest
    assert waiting.next({"loud": 1}) == ("loud-2", "loud")
    assert waiting.next({}) is None


def test_one_that_waited_past_the_timeout_leaves_the_line() -> None:
    waiting, clock = line(length=4, timeout=2.0)
    waiting.join("old", "a", {})
    clock.now += 1.5
    waiting.join("new", "b", {})
    assert waiting.seconds_to_expiry() == 0.5
    assert waiting.expired() == []
    clock.now += 0.6
    assert waiting.expired() == ["old"]
    assert waiting.next({}) == ("new", "b")
    assert waiting.seconds_to_expiry() is None


def test_arrivals_are_halved_every_second_so_a_peer_that_calmed_down_is_quiet_again() -> None:
    waiting, clock = line(length=1)
    for _ in range(8):
        waiting.arrived("was-loud")
    clock.now += 3.0  # 8 -> 1
    waiting.arrived("steady")
    waiting.arrived("steady")
    assert waiting.join("steady-1", "steady", {}) is None
    # Both have one in line; "was-loud" now counts 1 arrival against "steady"'s 2.
    assert waiting.join("was-loud-1", "was-loud", {}) == "steady-1"


def test_clear_hands_back_everything_in_line() -> None:
    waiting, _ = line(length=4)
    waiting.join("a-1", "a", {})
    waiting.join("b-1", "b", {})
    assert sorted(waiting.clear()) == ["a-1", "b-1"]
    assert len(waiting) == 0


class Held(NamedTuple):
    peer: str
    opened: float
    answered: bool = False


def test_a_newcomer_takes_the_busiest_peers_oldest_slot_an_answered_one_first() -> None:
    serving = [Held("a", 1), Held("a", 2, answered=True), Held("a", 3), Held("b", 0)]
    assert waitline.slot_to_take(serving, "c") == Held("a", 2, answered=True)
    assert waitline.slot_to_take(serving, "b") == Held("a", 2, answered=True)
    unanswered = [Held("a", 3), Held("a", 1), Held("b", 0)]
    assert waitline.slot_to_take(unanswered, "c") == Held("a", 1)


def test_a_newcomer_from_a_peer_as_busy_as_the_busiest_takes_nothing() -> None:
    assert waitline.slot_to_take([Held("a", 1), Held("b", 2)], "a") is None
    assert waitline.slot_to_take([Held("a", 1), Held("a", 2)], "a") is None
    assert waitline.slot_to_take([], "a") is None
