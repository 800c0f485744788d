"""`Readings` is required of every reader: none can forget the labelled namespaces.

A reader once took `readings: Readings | None = None`, and a forgotten argument meant a fresh
`Readings` that knew no labelled namespace, so a CronJob opted in by its namespace's label
read as off there and nowhere else (architecture review 2026-12-05, §2.3).
"""

from __future__ import annotations

import ast
import datetime
from collections.abc import Callable
from typing import Any

import pytest

from cronlock_operator.cronjob.reading import Readings, read_config
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.reconcile import cronjobs
from cronlock_operator.runtime.executor import Executor
from cronlock_operator.runtime.ticks import TickWatch
from cronlock_operator.status.model import rows
from tests.support import gen
from tests.support.cronjobs import SETTINGS
from tests.support.paths import ROOT

OPERATOR_SRC = ROOT / "operator" / "src" / "cronlock_operator"
NAMESPACE = "team-a"
NOW = datetime.datetime(2026, 12, 3, 10, 0, tzinfo=datetime.UTC)


def enrolled() -> dict[str, Any]:
    """A CronJob with no `cronlock.io/enabled` of its own, as the API server stores it: only
    its namespace's label can guard it (it runs as a ServiceAccount of its own, so the label
    does guard it: `config.declined_because`)."""
    return gen.cronjob(
        "report",
        gen.in_namespace(NAMESPACE),
        gen.with_annotations({"cronlock.io/ttl": "90s"}),
        gen.service_account("reports"),
        gen.with_uid("uid-report"),
        gen.as_stored(),
    )


def by_read_config(body: dict[str, Any], readings: Readings) -> bool:
    return read_config(body, SETTINGS, readings).config is not None


def by_decide(body: dict[str, Any], readings: Readings) -> bool:
    decision = cronjobs.decide(
        cronjobs.CronJobInput(body),
        SETTINGS,
        readings=readings,
    )
    return decision.guard is not None


def by_pending_guard(body: dict[str, Any], readings: Readings) -> bool:
    return cronjobs.pending_guard(body, SETTINGS, readings) is not None


def by_pending_guards(body: dict[str, Any], readings: Readings) -> bool:
    guards = cronjobs.pending_guards(
        [body],
        SETTINGS,
        refused=(),
        leases={},
        readings=readings,
    )
    return bool(guards)


def by_status_rows(body: dict[str, Any], readings: Readings) -> bool:
    return bool(rows([body], [], NOW, readings=readings))


def by_tick_watch(body: dict[str, Any], readings: Readings) -> bool:
    executor = Executor(
        kube=None,  # type: ignore[arg-type]  # nothing here is carried out
        cronjob_written=lambda body: None,
        lease_written=lambda body: None,
        post_event=lambda body, reason, message, warning: None,
    )
    watch = TickWatch(SETTINGS, executor, ObjectCache(), lambda ns, lock: False, readings=readings)
    watch.cronjob_seen((NAMESPACE, "report"), body)
    return watch.due() == [(NAMESPACE, "report")]


Reader = Callable[[dict[str, Any], Readings], bool]
READERS: dict[str, Reader] = {
    "read_config": by_read_config,
    "cronjobs.decide": by_decide,
    "cronjobs.pending_guard": by_pending_guard,
    "cronjobs.pending_guards": by_pending_guards,
    "status rows": by_status_rows,
    "TickWatch (missed runs)": by_tick_watch,
}


@pytest.mark.parametrize("guarded", READERS.values(), ids=READERS.keys())
def test_a_cronjob_of_a_labelled_namespace_is_guarded_through_every_reader(
    guarded: Reader,
) -> None:
    assert guarded(enrolled(), Readings(labelled=[NAMESPACE])), "the label guards it"
    # The same CronJob and the same reader, under Readings that do not know the label: off.
    # What was a forgotten argument is now this, written out, or a type error.
    assert not guarded(enrolled(), Readings(labelled=["team-b"]))


def _names_readings(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        (isinstance(node, ast.Name) and node.id == "Readings")
        or (isinstance(node, ast.Attribute) and node.attr == "Readings")
        for node in ast.walk(annotation)
    )


def _readings_parameters() -> list[tuple[str, ast.arg, ast.expr | None]]:
    """Every parameter of operator/src typed with `Readings` or named `readings`: (where,
    the parameter, its default or None)."""
    found: list[tuple[str, ast.arg, ast.expr | None]] = []
    for path in sorted(OPERATOR_SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = node.args
            positional = [*arguments.posonlyargs, *arguments.args]
            defaults: list[ast.expr | None] = [None] * (
                len(positional) - len(arguments.defaults)
            ) + list(arguments.defaults)
            pairs = [*zip(positional, defaults, strict=True)]
            pairs += zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
            for arg, default in pairs:
                if arg.arg == "readings" or _names_readings(arg.annotation):
                    where = f"{path.relative_to(ROOT)}:{arg.lineno} {node.name}({arg.arg})"
                    found.append((where, arg, default))
    return found


def test_every_reader_takes_readings_without_a_default() -> None:
    """No `Readings | None`, no default of any kind: a reader is handed the runtime's."""
    found = _readings_parameters()
    # The readers of today, so that this cannot pass by finding nothing.
    names = {where.split(" ")[1] for where, _, _ in found}
    assert {
        "read_config(readings)",
        "counting_settings(readings)",
        "decide(readings)",
        "pending_guard(readings)",
        "pending_guards(readings)",
        "judge(readings)",
        "not_succeeding(readings)",
        "rows(readings)",
        "__init__(readings)",
    } <= names
    loose = [
        f"{where}: {ast.unparse(arg.annotation) if arg.annotation else 'untyped'}"
        + (f" = {ast.unparse(default)}" if default is not None else "")
        for where, arg, default in found
        if default is not None
        or arg.annotation is None
        or ast.unparse(arg.annotation) != "Readings"
    ]
    assert loose == [], "take `readings: Readings`, required (docs/DESIGN.md, Readings)"


def test_no_optional_readings_is_written_anywhere_in_the_operator() -> None:
    """The spelling itself, in any position (a field, an alias, a return type)."""
    spellings = ("Readings | None", "Optional[Readings]", "None | Readings")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(OPERATOR_SRC.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(spelling in line for spelling in spellings)
    ]
    assert found == []
