"""DESIGN.md's rule "a Lease is read only through lock.model.read_lease": no operator module
reads a Lease's spec field itself (issue 57; reconcile/repair.py read holderIdentity)."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

SPEC_FIELDS = ("holderIdentity", "leaseTransitions", "renewTime", "acquireTime",
               "leaseDurationSeconds")  # fmt: skip
# A read: `.get("field"` or `["field"]`; a key of a dict being written is no read.
READ = re.compile(r"""(?:\.get\(\s*|\[\s*)["'](""" + "|".join(SPEC_FIELDS) + r""")["']""")


def test_no_operator_module_reads_a_lease_field_past_the_lock_model() -> None:
    reads = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "operator" / "src").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if READ.search(line)
    ]
    assert reads == []


def test_the_check_finds_a_read_as_repair_py_had_it() -> None:
    assert READ.search('    if spec.get("holderIdentity"):')
    assert READ.search('transitions = lease["spec"]["leaseTransitions"]')
    assert not READ.search('        "renewTime": _iso(row.renewed_at),')
