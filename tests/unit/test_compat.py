"""The compatibility ring's own logic (tests/compat.py): its slice names real e2e tests,
every release it runs has a pinned module, and a failed test fails its check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import compat
from tests.support.paths import ROOT
from tests.support.versions import pinned


def test_every_test_of_the_slice_exists() -> None:
    for check, tests in compat.SLICE.items():
        assert tests, check
        for test in tests:
            path, name = test.split("::")
            source = (ROOT / path).read_text()
            assert re.search(rf"^def {re.escape(name)}\(", source, re.M), (check, test)


def test_every_compatible_release_has_its_module_pinned_and_the_default_is_the_last() -> None:
    releases = compat.compatible_releases()
    assert releases[-1] == pinned("KUBERNETES_VERSION")
    minors = [int(release.split(".")[1]) for release in releases]
    assert minors == list(range(30, minors[-1] + 1)), "one release of every minor from 1.30"
    chart = (ROOT / "charts/cronlock/Chart.yaml").read_text()
    assert 'kubeVersion: ">=1.30.0-0"' in chart, "the oldest release is the chart's floor"
    for release in releases[:-1]:
        module = ROOT / f"tests/controlplane/go/kubernetes-1.{release.split('.')[1]}"
        assert f"require k8s.io/kubernetes {release}\n" in (module / "go.mod").read_text()
        assert (module / "go.sum").stat().st_size > 0


def test_a_failed_or_missing_test_fails_its_check_and_the_table_shows_it() -> None:
    # Two checks of different tests (the slice's first two share one).
    first = next(iter(compat.SLICE))
    second = next(check for check, tests in compat.SLICE.items() if tests != compat.SLICE[first])
    log = "\n".join(
        [
            "===== short test summary info =====",
            *(f"PASSED {test}" for tests in compat.SLICE.values() for test in tests),
        ]
    )
    passing = compat.Result("v1.36.3", compat.outcomes_of(log), 200.0, 300.0)
    assert passing.green
    broken_test = compat.SLICE[first][0]
    failing_log = log.replace(f"PASSED {broken_test}", f"FAILED {broken_test} - AssertionError")
    failing = compat.Result("v1.30.14", compat.outcomes_of(failing_log), 240.0, 310.0)
    assert failing.check(first) == "FAIL"
    assert failing.check(second) == "pass"
    assert not failing.green
    missing = compat.Result("v1.31.14", {}, 10.0, 0.0, "build failed (exit 1)")
    assert not missing.green
    text = compat.table([failing, missing, passing])
    assert text.splitlines()[0] == "| check | v1.30.14 | v1.31.14 | v1.36.3 |"
    assert f"| {first} | FAIL | FAIL | pass |" in text
    assert "| build / slice (s) | 240 / 310 | 10 / 0 | 200 / 300 |" in text
    assert "- v1.31.14: build failed (exit 1)" in text


def test_the_table_replaces_only_what_lies_between_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "COMPATIBILITY.md"
    doc.write_text(f"# Title\n\nbefore\n{compat.BEGIN}\nold table\n{compat.END}\nafter\n")
    compat.write(doc, "new table")
    assert doc.read_text() == (
        f"# Title\n\nbefore\n{compat.BEGIN}\nnew table\n{compat.END}\nafter\n"
    )
    (tmp_path / "other.md").write_text("no markers\n")
    with pytest.raises(SystemExit, match="no <!-- compat-table:begin -->"):
        compat.write(tmp_path / "other.md", "x")
