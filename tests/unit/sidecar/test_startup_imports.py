"""A short `run` is mostly interpreter start-up and imports: keep heavy modules off its path.

`cronlock-sidecar run -- true` has a wall-time goal (at most twice one `kubectl get lease`),
and what it imports before its first request is most of what it costs. These checks import
the modules of a path in a fresh interpreter and name what must not come along, so a new
top-level import of one of them fails here instead of quietly slowing every run.
(test_http11.py checks the HTTP client's part, http.client and email, on its own.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cronlock_sidecar
from cronlock_sidecar.holding.lease import Acquired, Busy, RenewOutcome, RenewResult
from cronlock_sidecar.lock.model import Timing
from cronlock_sidecar.options import Options, parse_options
from cronlock_sidecar.transport.kubeconfig import Cluster
from cronlock_sidecar.transport.seam import LeaseRef

# What `cli.main` imports for `run` (the `run` module itself is imported inside main()).
RUN_PATH = (
    "cronlock_sidecar.cli",
    "cronlock_sidecar.commands.run",
    "cronlock_sidecar.transport.kubeapi",
)
GATE_PATH = ("cronlock_sidecar.cli", "cronlock_sidecar.commands.gate")
# What `hold` imports before it decides: the HTTP server comes after (pod/serving.py).
HOLD_PATH_TO_THE_DECISION = (
    "cronlock_sidecar.cli",
    "cronlock_sidecar.options",
    "cronlock_sidecar.pod.logs",
    "cronlock_sidecar.commands.hold",
    "cronlock_sidecar.pod.serving",
    "cronlock_sidecar.pod.stopping",
    "cronlock_sidecar.transport.kubeapi",
    "cronlock_sidecar.transport.kubeconfig",
)
# The gate as the operator runs it starts in front of every guarded run's work: none of
# these (measured with `python -X importtime`: logging ~13 ms with traceback and string,
# argparse ~5 ms with gettext, pathlib ~4 ms, typing ~3 ms).
NOT_ON_THE_GATE_PATH = [
    "logging", "argparse", "gettext", "pathlib", "typing", "json", "tempfile",
    "dataclasses", "http", "email", "ssl", "socket", "threading",
    "cronlock_sidecar.options", "cronlock_sidecar.holding", "cronlock_sidecar.transport",
    "cronlock_sidecar.stores",
]  # fmt: skip

# Module -> why it is not needed at start-up (and roughly what it cost, measured with
# `python -X importtime` on the benchmark machine).
NOT_ON_THE_RUN_PATH = {
    "dataclasses": "records are NamedTuples or plain classes (~6 ms with inspect and ast)",
    "inspect": "came with dataclasses",
    "ast": "came with dataclasses",
    "tempfile": "only a kubeconfig with inline client key data needs it (~4 ms)",
    "shutil": "came with tempfile",
    "random": "came with tempfile",
    "secrets": "the random identity suffix is os.urandom(4).hex() (~2 ms with hashlib, hmac)",
    "hashlib": "came with secrets",
    "hmac": "came with secrets",
    "http.client": "the sidecar has its own HTTP/1.1 client (~21 ms with email)",
    "email": "came with http.client",
    "yaml": "a JSON kubeconfig is read without it; YAML is parsed only when met",
    "redis": "redis-py is imported only when `--store redis://…` chooses Redis",
    "psycopg": "psycopg is imported only when `--store postgresql://…` chooses PostgreSQL",
    "cronlock_sidecar.lock.schedule": "the cron parser is imported only when `--schedule` is given",
    "zoneinfo": "a time zone is read only for `--schedule` (came with the parser, ~3 ms)",
}


def imported_by(modules: tuple[str, ...]) -> set[str]:
    """Every module in sys.modules of a fresh interpreter after importing `modules`."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(result.stdout))


def heavy(loaded: set[str], names: list[str]) -> list[str]:
    return sorted(
        module for module in loaded if any(module == n or module.startswith(n + ".") for n in names)
    )


def test_the_run_path_imports_none_of_the_modules_it_does_not_need_at_start_up() -> None:
    loaded = imported_by(RUN_PATH)
    assert heavy(loaded, list(NOT_ON_THE_RUN_PATH)) == []


def test_the_gate_path_does_not_import_tempfile_or_dataclasses() -> None:
    # gate only reads the decision file; writing it (tempfile) is hold's job.
    loaded = imported_by(GATE_PATH)
    assert heavy(loaded, ["tempfile", "dataclasses", "http.client", "email"]) == []


def test_the_gate_as_the_operator_runs_it_imports_only_what_reading_a_file_needs(
    tmp_path: Path,
) -> None:
    (tmp_path / "decision").write_text("run\n")
    code = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "from cronlock_sidecar.cli import main\n"
        f"code = main(['gate'], {{'CRONLOCK_RUN_DIR': {str(tmp_path)!r}, "
        "'CRONLOCK_WAIT_TIMEOUT': '0s'})\n"
        "print(json.dumps([code, sorted(set(sys.modules) - before)]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    exit_code, loaded = json.loads(result.stdout)
    assert exit_code == 0
    assert "lease acquired; starting the run" in result.stderr
    assert heavy(set(loaded), NOT_ON_THE_GATE_PATH) == []


# What the gate's plain line and its reading of durations do without (`python -X
# importtime -S`: `re` with `enum`, `functools` and `collections` was most of the gate's
# import time; `datetime` only a JSON line needs). Python's `site` imports `re` and `enum`
# itself, so only an interpreter started as the image starts it, with `-S`, shows them.
NOT_ON_THE_IMAGE_GATE_PATH = ["re", "enum", "functools", "collections", "datetime"]


def test_the_gate_as_the_image_starts_it_imports_no_re_nor_datetime(tmp_path: Path) -> None:
    (tmp_path / "decision").write_text("run\n")
    package_root = Path(cronlock_sidecar.__file__).resolve().parent.parent
    # json (which imports re) only once the gate has run.
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"sys.path.insert(0, {str(package_root)!r})\n"
        "from cronlock_sidecar.cli import main\n"
        f"code = main(['gate'], {{'CRONLOCK_RUN_DIR': {str(tmp_path)!r}, "
        "'CRONLOCK_WAIT_TIMEOUT': '1m30s', 'CRONLOCK_JITTER': '250ms'})\n"
        "loaded = sorted(set(sys.modules) - before)\n"
        "import json\n"
        "print(json.dumps([code, loaded]))\n"
    )
    # -S as the image's launcher runs it (Dockerfile): no site, so nothing is loaded before.
    result = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    exit_code, loaded = json.loads(result.stdout)
    assert exit_code == 0
    assert "lease acquired; starting the run" in result.stderr
    assert heavy(set(loaded), NOT_ON_THE_IMAGE_GATE_PATH) == []


def test_hold_decides_before_it_imports_the_http_server() -> None:
    loaded = imported_by(HOLD_PATH_TO_THE_DECISION)
    assert heavy(loaded, ["http.server", "cronlock_sidecar.pod.endpoints", "email"]) == []


def test_the_import_check_sees_a_module_that_is_imported() -> None:
    # Guards the guard: the subprocess really reports what it imported.
    assert "tempfile" in imported_by(("tempfile",))


# The records that were frozen dataclasses keep what callers relied on.
RECORDS = [
    LeaseRef(namespace="default", name="cronlock-report"),
    Timing.of(60, 20, 2),
    Acquired(
        lease=LeaseRef("default", "cronlock-report"),
        holder="pod-a",
        transitions=3,
        acquire_time="2026-01-01T00:00:00.000000Z",
        resumed=False,
        reason="free",
    ),
    Busy(lease=LeaseRef("default", "cronlock-report"), holder="pod-b", renewed_ago=1, expires_in=2),
    RenewResult(RenewOutcome.FAILED, "timed out"),
    parse_options(["run", "--lease", "default/cronlock-report", "--", "true"], {}),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda record: type(record).__name__)
def test_records_stay_immutable_hashable_and_equal_by_value(record: Any) -> None:
    with pytest.raises(AttributeError):
        setattr(record, record._fields[0], None)
    rebuilt = type(record)(**record._asdict())  # keyword construction
    assert record == rebuilt
    assert record is not rebuilt
    assert hash(record) == hash(rebuilt)
    assert record  # truthy, as a dataclass instance was


def test_record_defaults_properties_and_methods_are_kept() -> None:
    assert RenewResult(RenewOutcome.RENEWED).detail == ""
    assert str(LeaseRef("default", "cronlock-report")) == "default/cronlock-report"
    assert repr(LeaseRef("default", "x")) == "LeaseRef(namespace='default', name='x')"
    timing = Timing.of(10.5, 3, 2)
    assert timing.lease_duration_seconds == 11
    assert timing.renew_deadline == pytest.approx(7.0)
    options = RECORDS[-1]
    assert isinstance(options, Options)
    assert options.timing == Timing.of(60.0, 20.0, 2.0)
    assert options.policy == "skip"
    assert options.gate_timeout == 60.0
    busy = RECORDS[3]
    assert isinstance(busy, Busy)
    assert busy.message().startswith("already running: lease default/cronlock-report held by pod-b")


def test_acquired_and_busy_stay_distinct_types() -> None:
    acquired, busy = RECORDS[2], RECORDS[3]
    assert acquired != busy
    assert isinstance(acquired, Acquired)
    assert not isinstance(acquired, Busy)
    assert isinstance(busy, Busy)
    assert not isinstance(busy, Acquired)


def test_cluster_keeps_dataclass_behaviour() -> None:
    cluster = Cluster(server="https://example:6443", ssl_context=None, token="t")  # noqa: S106
    same = Cluster("https://example:6443", None, "t")
    assert cluster == same
    assert cluster != Cluster("https://example:6443", None, "other")
    assert cluster.token_file is None
    assert cluster.namespace == ""
    assert cluster.source == ""
    assert (cluster.host, cluster.port, cluster.scheme, cluster.base_path) == (
        "example",
        6443,
        "https",
        "",
    )
    assert cluster.bearer_token() == "t"
    assert repr(cluster) == (
        "Cluster(server='https://example:6443', ssl_context=None, token='t', "
        "token_file=None, namespace='', source='', tls_server_name='', credential=None, "
        "proxy='')"
    )
    cluster.namespace = "team-a"  # mutable, as the dataclass was
    assert cluster.namespace == "team-a"
    assert cluster != same
    with pytest.raises(TypeError):
        hash(cluster)  # unhashable, as an eq=True, non-frozen dataclass was
