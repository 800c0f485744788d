"""The papers a user reads first name everything there is: the chart's NOTES.txt (what
`helm install` prints) and docs/USAGE.md list every annotation a user may set (the
operator's own list, contract.USER_SETTINGS) and every Event reason the operator posts
(read from its code: each PostEvent, once, warn_once, event and post_event call's reason)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cronlock_sidecar import contract
from tests.support.paths import ROOT

NOTES = ROOT / "charts" / "cronlock" / "templates" / "NOTES.txt"
USAGE = ROOT / "docs" / "USAGE.md"
OPERATOR = ROOT / "operator" / "src" / "cronlock_operator"
# The calls whose second argument is an Event's reason.
POSTING = {"PostEvent", "once", "warn_once", "event", "_event", "post_event"}


def posted_reasons(root: Path = OPERATOR) -> dict[str, str]:
    """Every reason a posting call names, as a literal or a module constant; reason -> file."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        constants = {}
        for node in ast.walk(tree):
            target = (
                node.targets[0]
                if isinstance(node, ast.Assign) and len(node.targets) == 1
                else node.target
                if isinstance(node, ast.AnnAssign)
                else None
            )
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                constants[target.id] = value.value
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in POSTING:
                continue
            argument = node.args[1]
            reason = (
                argument.value
                if isinstance(argument, ast.Constant)
                else constants.get(argument.id)
                if isinstance(argument, ast.Name)
                # The sidecar's contract names the reasons both sides share.
                else getattr(contract, argument.attr, None)
                if isinstance(argument, ast.Attribute)
                and isinstance(argument.value, ast.Name)
                and argument.value.id == "contract"
                else None
            )
            if isinstance(reason, str) and re.fullmatch(r"[A-Z][A-Za-z]+", reason):
                found[reason] = str(path.relative_to(ROOT))
    return found


def test_the_scan_finds_the_reasons_the_operator_posts() -> None:
    reasons = posted_reasons()
    # Literals, module constants (Missed, ChangedByAdmission) and each posting helper.
    assert {"Injected", "Missed", "ChangedByAdmission", "InvalidConfig", "Conflict"} <= set(reasons)
    assert "NotReverted" in reasons  # the uninstall hook's
    assert len(reasons) >= 15


def test_notes_and_usage_name_every_annotation_a_user_may_set() -> None:
    notes = NOTES.read_text()
    settings = {name.removeprefix(contract.PREFIX) for name in contract.USER_SETTINGS}
    assert set(re.findall(r"cronlock\.io/([a-z]+(?:-[a-z]+)*)", notes)) == settings
    usage = USAGE.read_text()
    table = usage[usage.index("## Annotations") : usage.index("Durations use Go syntax")]
    assert set(re.findall(r"(?m)^\| `([a-z-]+)` \|", table)) == settings


def test_notes_and_usage_name_every_event_the_operator_posts() -> None:
    reasons = set(posted_reasons())
    notes = NOTES.read_text()
    events = notes[notes.index("   Events: ") : notes.index("4. To opt out")]
    assert set(re.findall(r"\b[A-Z][A-Za-z]+\b", events)) - {"Events", "Warnings"} == reasons
    usage = USAGE.read_text()
    listed = usage[usage.index("- Events on the CronJob:") :]
    listed = listed[: listed.index("\n- ")]
    assert set(re.findall(r"`([A-Z][A-Za-z]+)`", listed)) == reasons
