"""DESIGN.md's rule "a Lease is read only through lock.model.read_lease": no operator module
reads a Lease's spec field itself (issue 57; reconcile/repair.py read holderIdentity) or
patches one by hand, and neither do the stores' Python modules."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import ROOT

SPEC_FIELDS = ("holderIdentity", "leaseTransitions", "renewTime", "acquireTime",
               "leaseDurationSeconds")  # fmt: skip
# A read: `.get("field"` or `["field"]`; a key of a dict being written, or an item assigned
# (`spec["renewTime"] = ...`), is no read.
READ = re.compile(
    r"""(?:\.get\(\s*|\[\s*)["'](""" + "|".join(SPEC_FIELDS) + r""")["'](?!\]\s*=[^=])"""
)
# A JSON patch's path to one of them, as repair.py wrote `/spec/leaseTransitions` itself.
PATCH = re.compile(r"""["']/spec/(""" + "|".join(SPEC_FIELDS) + r""")["']""")


def reads_in(folder: Path) -> list[str]:
    """Each line under `folder` that reads a Lease's spec field itself."""
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(folder.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if READ.search(line)
    ]


def test_no_operator_module_reads_a_lease_field_past_the_lock_model() -> None:
    assert reads_in(ROOT / "operator" / "src") == []


def test_the_stores_read_a_lease_through_the_lock_model() -> None:
    """Issue 57: the stores' Python side reads a holder, a token and a renewal through
    `lock.model` (`holder_of`, `with_token`, `read_lease`); their SQL and Lua keep their own."""
    assert reads_in(ROOT / "sidecar" / "src" / "cronlock_sidecar" / "stores") == []


def test_no_operator_module_patches_a_lease_field_itself() -> None:
    """A JSON patch of a Lease's spec comes from the lock model (`cleared`, `token_set`)."""
    writes = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "operator" / "src").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PATCH.search(line)
    ]
    assert writes == []


def test_the_check_finds_a_read_as_repair_py_had_it() -> None:
    assert READ.search('    if spec.get("holderIdentity"):')
    assert READ.search('transitions = lease["spec"]["leaseTransitions"]')
    assert not READ.search('        "renewTime": _iso(row.renewed_at),')
    assert not READ.search('        spec["renewTime"] = format_microtime(renewal)')
    assert READ.search('    if spec["holderIdentity"] == me:')
    assert PATCH.search('{"op": "replace", "path": "/spec/leaseTransitions", "value": 0}')
