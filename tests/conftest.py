"""Fixtures shared by every ring: the local control plane, namespaces, ServiceAccount clients."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import kubernetes
import pytest

from tests.support import evidence
from tests.support.controlplane import (
    ControlPlane,
    ServiceAccountKubeconfig,
    make_service_account_kubeconfig,
    started,
)
from tests.support.operator import OPERATOR_NAMESPACE, OperatorProcess, install_chart_rbac
from tests.support.paths import ROOT


@pytest.fixture(scope="session")
def controlplane() -> Iterator[ControlPlane]:
    """One control plane per test session: the user's own, or ours started and stopped here."""
    external = os.environ.get("CRONLOCK_TEST_KUBECONFIG")
    env = dict(os.environ)
    if external:
        env["KUBECONFIG"] = external
        plane = ControlPlane(Path(external), env, None)
        yield plane
        plane.close()
        return
    env_dir = ROOT / ".testenv" / f"pytest-{os.getpid()}"
    with started(env_dir) as plane:
        yield plane
    if not os.environ.get("CRONLOCK_KEEP_TESTENV"):
        shutil.rmtree(env_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def api(controlplane: ControlPlane) -> kubernetes.client.ApiClient:
    """An admin client (system:masters)."""
    return controlplane.api_client()


@pytest.fixture
def namespace(api: kubernetes.client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    stem = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{stem}-{secrets.token_hex(3)}"
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace(
        {"metadata": {"name": name, "labels": {"cronlock.test/namespace": "true"}}}
    )
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def service_account_kubeconfig(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, tmp_path: Path
) -> ServiceAccountKubeconfig:
    """Make a kubeconfig that authenticates as a ServiceAccount (RBAC applies for real)."""

    def make(namespace: str, name: str) -> Path:
        return make_service_account_kubeconfig(controlplane, api, namespace, name, tmp_path)

    return make


@pytest.fixture(scope="session")
def operator_kubeconfig(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """Credentials of the chart's ServiceAccount, with exactly the chart's RBAC installed."""
    account = install_chart_rbac(api, controlplane.env)
    return make_service_account_kubeconfig(
        controlplane, api, OPERATOR_NAMESPACE, account, tmp_path_factory.mktemp("operator")
    )


@pytest.fixture(scope="module")
def operator(
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The real operator, watching every namespace as the chart's ServiceAccount.

    One per test module, so modules that do not ask for it see no operator at all.
    """
    log = tmp_path_factory.mktemp("operator-log") / "operator.log"
    process = OperatorProcess(operator_kubeconfig, log, controlplane.env)
    process.start()
    yield process
    process.stop()


# --- No silent skip ------------------------------------------------------------------------
# A skipped, xfailed or deselected test did not show what it claims, and a green run must
# mean that every collected test ran and passed: the session fails when any was left out,
# naming each. Narrowing a run by hand (-k, -m, --deselect, --lf, --sw on the command line)
# deselects on purpose and is allowed, but never under CI (CI set), whose command is fixed.

SELECTING = ("-k", "-m", "--deselect", "--lf", "--last-failed", "--sw", "--stepwise")


class NotRun:
    """Every test the session left out, by how: skipped, xfailed, xpassed, deselected."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.left_out: dict[str, list[str]] = {
            "skipped": [],
            "xfailed": [],
            "xpassed": [],
            "deselected": [],
        }

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(report, "wasxfail"):
            how = "xfailed" if report.skipped else "xpassed"
            if report.when == "call" or report.skipped:
                self.left_out[how].append(f"{report.nodeid} ({report.wasxfail or 'xfail'})")
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            self.left_out["skipped"].append(f"{report.nodeid} ({reason})")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # A module that skips itself while collected (`pytest.skip(allow_module_level=True)`,
        # `pytest.importorskip`) leaves out every test in it without one test report: pytest
        # then says "1 passed, 2 skipped" and exits 0.
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            self.left_out["skipped"].append(f"{report.nodeid} (the whole module: {reason})")

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self.left_out["deselected"].extend(item.nodeid for item in items)

    def failing(self) -> dict[str, list[str]]:
        found = {how: ids for how, ids in self.left_out.items() if ids}
        if found.keys() == {"deselected"} and narrowed_by_hand(self.config):
            return {}
        return found

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.failing() and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        found = self.failing()
        if not found:
            return
        counts = ", ".join(f"{len(ids)} {how}" for how, ids in found.items())
        terminalreporter.section("tests left out: the run fails", red=True, bold=True)
        terminalreporter.write_line(
            f"{counts}. Every collected test must run and pass (tests/conftest.py): a test "
            "that cannot run here is a failure, not a skip."
        )
        for how, ids in found.items():
            for nodeid in ids[:50]:
                terminalreporter.write_line(f"  {how}: {nodeid}")
            if len(ids) > 50:
                terminalreporter.write_line(f"  ... and {len(ids) - 50} more {how}")
        if "deselected" in found:
            terminalreporter.write_line(
                "  deselection is allowed only when asked for on the command line "
                f"({', '.join(SELECTING)}) and CI is not set"
            )


def narrowed_by_hand(config: pytest.Config) -> bool:
    """The person running pytest chose a subset on its command line (not addopts, not CI)."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        return False
    args = [str(arg) for arg in config.invocation_params.args]
    return any(
        arg == flag or arg.startswith(flag + "=") or (flag in ("-k", "-m") and arg.startswith(flag))
        for arg in args
        for flag in SELECTING
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(NotRun(config), "cronlock-not-run")


# --- Any order ------------------------------------------------------------------------------
# A test that passes only after another (it relies on what that one built, started or left
# behind) is a defect: CRONLOCK_TEST_ORDER=reverse runs the collected tests last to first
# (modules, and tests within each, reversed; module and session fixtures still set up once),
# so such a dependency shows up as a failure.
ORDERS = ("collected", "reverse")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = os.environ.get("CRONLOCK_TEST_ORDER") or "collected"
    if order not in ORDERS:
        raise pytest.UsageError(
            f"CRONLOCK_TEST_ORDER={order!r}: expected one of {', '.join(ORDERS)}"
        )
    if order == "reverse":
        items.reverse()


# --- Evidence of failures ---------------------------------------------------------------------
# A test on the real node that fails keeps its pods' logs, Events, Leases' history and the
# kubelet's lines (tests/support/evidence.py); the summary names each folder, so CI's log
# (the rings print each ring's log whole) says where to look.


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[None] | pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed:
        item.stash[evidence.FAILED_CALL] = True
    return report


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    folders = config.stash.get(evidence.EVIDENCE, [])
    if folders:
        terminalreporter.section("evidence of the failed tests", red=True, bold=True)
        for folder in folders:
            terminalreporter.write_line(f"  {folder}")
