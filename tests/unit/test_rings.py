"""`make test` runs the rings side by side (tests/rings.py): together they are exactly
pyproject's testpaths, every test file lies in one, and a failing ring fails the run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import rings
from tests.support.node import e2e_node_index
from tests.support.paths import ROOT


def test_the_rings_are_exactly_the_testpaths_and_hold_every_test_file() -> None:
    paths = rings.configured_testpaths()
    rings.check_rings(rings.RINGS, paths)
    outside = [
        str(found.relative_to(ROOT))
        for found in (ROOT / "tests").rglob("test_*.py")
        if not any(found.is_relative_to(ROOT / path) for path in paths)
    ]
    assert outside == [], "test files no ring runs; add their folder to testpaths and RINGS"
    # The e2e rings start their nodes, which own host paths: each runs alone in its
    # process, and at once (what they need is built before the rings start).
    assert "tests/e2e" in paths
    assert rings.RINGS["e2e"] == ("tests/e2e",)
    assert set(rings.BEFORE) <= set(rings.RINGS)
    assert "e2e" not in rings.BEFORE
    assert "e2e-b" not in rings.BEFORE
    assert set(rings.ENV) <= set(rings.RINGS)


def test_the_second_e2e_ring_runs_its_files_on_node_5_and_the_first_ignores_them() -> None:
    split = rings.RINGS["e2e-b"]
    assert split, "the second e2e ring runs nothing"
    assert all(path.startswith("tests/e2e/test_") for path in split), split
    assert rings.ENV["e2e-b"] == {"CRONLOCK_E2E_NODE": "5"}
    assert rings.ignored(rings.RINGS, "e2e") == split
    assert rings.ignored(rings.RINGS, "e2e-b") == ()
    # Node 5 is a cluster of its own: no node 2, no registry, and its pods reach only its
    # own link, not node 1's. A file that needs any of them belongs in the "e2e" ring.
    for path in split:
        text = (ROOT / path).read_text()
        for needs in ("second_node", "fleet_node", "registry", "HOST_LINK_IP"):
            assert needs not in text, f"{path} uses {needs}: node 1's; move it to the e2e ring"


def test_the_second_integration_ring_runs_its_files_and_the_first_ignores_them() -> None:
    split = rings.RINGS["integration-b"]
    assert split, "the second integration ring runs nothing"
    assert all(path.startswith("tests/integration/test_") for path in split), split
    left_out = rings.ignored(rings.RINGS, "unit+integration")
    assert set(split) <= set(left_out)
    assert rings.ignored(rings.RINGS, "integration-b") == ()
    assert "integration-b" not in rings.BEFORE
    assert "integration-b" not in rings.ENV


# What in a test file runs a Go test tool: gotool itself, the PromQL engine's tool
# (tests/support/prometheus.py), helm-docs (charts/readme).
TOOL_USES = re.compile(r"\bgotool\(|\bpromql_eval\(|\bengine_agrees\(|charts\W+readme|\"readme\"")


def test_the_tools_ring_builds_the_go_test_tools_and_runs_every_file_that_uses_one() -> None:
    """On a fresh machine the tools take minutes to build (4:46 at fbee60d): the ring that
    builds them runs the only unit and integration files that need them, so no other
    ring's tests start late or wait in a test's timeout for a build (docs/DEVELOPMENT.md)."""
    assert any("prebuild --tools" in step for step in rings.BEFORE["tools"])
    others = [step for name, steps in rings.BEFORE.items() if name != "tools" for step in steps]
    assert not any("--tools" in step or "gotool" in step for step in others), others
    assert set(rings.ignored(rings.RINGS, "unit+integration")) >= set(rings.RINGS["tools"])
    uses = sorted(
        str(found.relative_to(ROOT))
        for testpath in ("tests/unit", "tests/integration")
        for found in (ROOT / testpath).rglob("test_*.py")
        if TOOL_USES.search(found.read_text()) and found.name != "test_rings.py"
    )
    assert uses == sorted(rings.RINGS["tools"]), (
        "a file that runs a Go test tool belongs in the tools ring"
    )


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"a": ("tests/unit",)}, "tests/e2e is a testpath in no ring"),
        ({"a": ("tests/unit", "tests/e2e"), "b": ("tests/e2e",)}, "tests/e2e is in more than"),
        ({"a": ("tests/unit", "tests/e2e", "tests/more")}, "tests/more is in a ring but not"),
    ],
)
def test_a_ring_layout_that_loses_or_repeats_tests_is_refused(
    given: dict[str, tuple[str, ...]], said: str
) -> None:
    with pytest.raises(SystemExit, match=said):
        rings.check_rings(given, ["tests/unit", "tests/e2e"])


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            {"a": ("tests/unit", "tests/e2e"), "b": ("tests/more/test_x.py",)},
            "tests/more/test_x.py is in a ring but not in pyproject's testpaths",
        ),
        (
            {"a": ("tests/unit", "tests/e2e", "tests/e2e/test_rings.py")},
            "tests/e2e/test_rings.py is in the same ring as tests/e2e, which holds it",
        ),
        (
            {
                "a": ("tests/unit", "tests/e2e"),
                "b": ("tests/e2e/test_rings.py",),
                "c": ("tests/e2e/test_rings.py",),
            },
            "tests/e2e/test_rings.py is in more than one ring",
        ),
        (
            {"a": ("tests/unit", "tests/e2e"), "b": ("tests/e2e/test_gone.py",)},
            "tests/e2e/test_gone.py is in a ring but does not exist",
        ),
        (
            {"a": ("tests/unit",), "b": ("tests/e2e/test_rings.py",)},
            "tests/e2e is a testpath in no ring",
        ),
    ],
)
def test_a_split_of_a_testpath_that_loses_or_repeats_tests_is_refused(
    given: dict[str, tuple[str, ...]], said: str, tmp_path: Path
) -> None:
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "e2e" / "test_rings.py").write_text("")
    with pytest.raises(SystemExit, match=said):
        rings.check_rings(given, ["tests/unit", "tests/e2e"], tmp_path)


def test_a_split_of_a_testpath_is_accepted_and_each_part_left_out_of_the_whole() -> None:
    given = {"a": ("tests/unit", "tests/e2e"), "b": ("tests/e2e/test_x.py", "tests/e2e/y")}
    rings.check_rings(given, ["tests/unit", "tests/e2e"])
    assert rings.ignored(given, "a") == ("tests/e2e/test_x.py", "tests/e2e/y")
    assert rings.ignored(given, "b") == ()
    # A name that merely starts like a testpath is not in it.
    with pytest.raises(SystemExit, match="tests/e2e-other is in a ring but not in"):
        rings.check_rings({**given, "c": ("tests/e2e-other",)}, ["tests/unit", "tests/e2e"])


def test_the_critical_path_is_the_longest_ring_and_by_how_much() -> None:
    said = rings.critical_path({"unit": 600.0, "e2e": 950.5, "e2e-b": 905.0, "x": 10.0})
    assert said == "rings: the critical path is e2e (15:50), 0:45 longer than e2e-b (15:05)"
    assert rings.critical_path({"only": 61.0}) == (
        "rings: the critical path is only (1:01), the only ring"
    )


def run_rings(
    project: Path,
    rings_: dict[str, tuple[str, ...]],
    before: dict[str, tuple[str, ...]],
    env: dict[str, dict[str, str]] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`rings.run` on a small project, in its own process as `make test` runs it."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests import rings\n"
        f"sys.exit(rings.run(['-p', 'no:cacheprovider'], {rings_!r}, Path({str(project)!r}),"
        f" {before!r}, {env or {}!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


SLOW_RING_TEST = """\
import re
import time
from pathlib import Path

def test_slow():
    log = Path(__file__).resolve().parent.parent / ".testenv" / "rings" / "fast.log"
    deadline = time.monotonic() + 50
    while not re.search(r"^=+ .* in [0-9.]+s", log.read_text() if log.exists() else "", re.M):
        assert time.monotonic() < deadline, "the fast ring never ended"
        time.sleep(0.1)
    time.sleep(2)
"""


def test_the_rings_run_at_once_and_one_failing_fails_the_run(tmp_path: Path) -> None:
    project = tmp_path / "project"
    for name, body in (
        # The slow ring ends after the fast one has: its test waits for the fast ring's
        # pytest summary in its log, then 2 s (a fixed 2 s was too little on a loaded
        # fresh machine, where the fast ring's start-up alone took longer).
        ("slow", SLOW_RING_TEST),
        ("fast", "def test_ok():\n    pass\n\ndef test_broken():\n    assert 1 == 2\n"),
    ):
        (project / name).mkdir(parents=True)
        (project / name / f"test_{name}.py").write_text(body)
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["slow", "fast"]\n'
    )
    done = run_rings(
        project,
        {"slow": ("slow",), "fast": ("fast",)},
        {"fast": ("echo built for fast > built", "cat built")},
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    # Both logs are printed whole, the fast ring's first: it ended first.
    assert out.index("ring fast (fast): exit 1") < out.index("ring slow (slow): exit 0"), out
    assert "FAILED fast/test_fast.py::test_broken" in out
    assert "1 failed, 1 passed" in out
    assert "fast               exit 1" in out
    assert "slow               exit 0" in out
    # The slow ring ended last (it sleeps; the fast one ended first, above).
    assert re.search(
        r"rings: the critical path is slow \(\d+:\d\d\), \d+:\d\d longer than fast", out
    ), out
    assert (project / ".testenv" / "rings" / "slow.log").read_text().count("test_slow.py .") == 1
    # The fast ring's steps ran first, in its process and log, before its pytest.
    fast_log = (project / ".testenv" / "rings" / "fast.log").read_text()
    assert fast_log.index("built for fast") < fast_log.index("test session starts")


def test_a_failing_step_before_a_ring_fails_it_and_its_tests_never_start(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "only").mkdir(parents=True)
    (project / "only" / "test_only.py").write_text("def test_ok():\n    pass\n")
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["only"]\n')
    done = run_rings(project, {"only": ("only",)}, {"only": ("echo building; exit 7",)})
    assert done.returncode == 7, done.stdout + done.stderr
    log = (project / ".testenv" / "rings" / "only.log").read_text()
    assert "building" in log
    assert "test session starts" not in log


def test_steps_for_a_ring_that_does_not_exist_are_refused() -> None:
    with pytest.raises(SystemExit, match="steps before nowhere, which is no ring"):
        rings.run(
            [],
            {"a": tuple(rings.configured_testpaths())},
            before={"nowhere": ("true",)},
        )


def test_a_testpath_split_between_rings_runs_each_test_once_each_with_its_rings_env(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    (project / "e2e").mkdir(parents=True)
    for name, which in (("a", None), ("b", "5"), ("c", None)):
        (project / "e2e" / f"test_{name}.py").write_text(
            f"import os\n\ndef test_{name}():\n"
            f"    assert os.environ.get('WHICH_NODE') == {which!r}\n"
        )
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["e2e"]\n')
    done = run_rings(
        project,
        {"one": ("e2e",), "two": ("e2e/test_b.py",)},
        {},
        {"two": {"WHICH_NODE": "5"}},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    logs = project / ".testenv" / "rings"
    one, two = (logs / "one.log").read_text(), (logs / "two.log").read_text()
    assert "2 passed" in one, one
    assert "test_b.py" not in one, one
    assert "1 passed" in two, two
    assert "test_a.py" not in two, two


def test_environment_for_a_ring_that_does_not_exist_is_refused() -> None:
    with pytest.raises(SystemExit, match="environment for nowhere, which is no ring"):
        rings.run([], {"a": tuple(rings.configured_testpaths())}, before={}, env={"nowhere": {}})


@pytest.mark.parametrize(("value", "index"), [(None, 1), ("", 1), ("1", 1), ("5", 5), (" 5 ", 5)])
def test_the_e2e_node_is_node_1_unless_the_ring_names_node_5(value: str | None, index: int) -> None:
    assert e2e_node_index({} if value is None else {"CRONLOCK_E2E_NODE": value}) == index


@pytest.mark.parametrize("value", ["2", "3", "0", "five", "-5"])
def test_an_e2e_node_that_is_no_cluster_node_of_ours_is_refused(value: str) -> None:
    # Node 2 joins node 1's fleet, nodes 3 and 4 are the clusters ring's.
    with pytest.raises(ValueError, match="the e2e node is one of 1, 5"):
        e2e_node_index({"CRONLOCK_E2E_NODE": value})


def test_what_failed_is_said_again_at_the_end_with_its_message_and_evidence() -> None:
    log = "\n".join(
        [
            "tests/e2e/test_shared_lock.py F" + " " * 40 + "[100%]",
            "=================================== FAILURES ===================================",
            "E       AssertionError: timed out after 60s waiting for the lock given back",
            "========================= evidence of the failed tests =========================",
            "  /tmp/x/.testenv/evidence/tests_e2e_test_shared_lock.py__test_two",
            "=========================== short test summary info ============================",
            "FAILED tests/e2e/test_shared_lock.py::test_two - AssertionError: " + "x" * 900,
            "ERROR tests/e2e/test_flood.py::test_one - TimeoutError",
            "========================= 1 failed, 1 error in 9.00s ==========================",
        ]
    )
    found = rings.failures(log)
    assert found[0] == "evidence: /tmp/x/.testenv/evidence/tests_e2e_test_shared_lock.py__test_two"
    assert found[1].startswith("FAILED tests/e2e/test_shared_lock.py::test_two - AssertionError")
    assert len(found[1]) == rings.FAILURE_LINE
    assert found[1].endswith("…")
    assert found[2] == "ERROR tests/e2e/test_flood.py::test_one - TimeoutError"
    assert len(found) == 3
    assert rings.failures("===== 3 passed in 1.00s =====\n") == []


def test_the_previous_release_is_built_beside_the_tests_not_before_the_critical_ring() -> None:
    """The previous release's images (only the e2e upgrade test needs them, near its end)
    are built by the longwatch ring, the one with the most time to spare, not by
    `prebuild --tools` before the unit and integration tests (docs/DEVELOPMENT.md)."""
    prebuild = (ROOT / "tests" / "controlplane" / "prebuild").read_text()
    assert "--tools) node=0 previous=0" in prebuild
    assert any("images --previous" in step for step in rings.BEFORE["longwatch"])
    others = [step for name, steps in rings.BEFORE.items() if name != "longwatch" for step in steps]
    assert not any("--previous" in step for step in others), others
