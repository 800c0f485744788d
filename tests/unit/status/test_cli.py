"""`cronlock status` as a command: flags, namespaces, exit codes and messages, over a fake API."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronlock_operator.status import cli as status
from tests.unit.status.objects import cronjob, lease


def kubeconfig(path: Path, server: str, namespace: str | None = None) -> Path:
    context: dict[str, str] = {"cluster": "fake", "user": "fake"}
    if namespace is not None:
        context["namespace"] = namespace
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "fake", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "fake", "context": context},
                    {"name": "other", "context": {"cluster": "fake", "user": "fake"}},
                ],
                "current-context": "fake",
            }
        )
    )
    return path


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def unreachable(tmp_path: Path, closed_port: int) -> Path:
    return kubeconfig(tmp_path / "config", f"http://127.0.0.1:{closed_port}", namespace="team-a")


class FakeApi(http.server.ThreadingHTTPServer):
    """Answers list requests for CronJobs and Leases from `objects`, or with `refuse`."""

    objects: dict[str, list[dict[str, Any]]]
    refuse: int | None = None
    paths: list[str]


class Handler(http.server.BaseHTTPRequestHandler):
    server: FakeApi

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        path = self.path.split("?")[0]
        if self.server.refuse is not None:
            self.reply(
                self.server.refuse,
                {
                    "kind": "Status",
                    "status": "Failure",
                    "message": 'cronjobs.batch is forbidden: User "jane" cannot list resource '
                    '"cronjobs" in API group "batch" in the namespace "team-a"',
                    "reason": "Forbidden",
                    "code": self.server.refuse,
                },
            )
            return
        kind = "cronjobs" if path.endswith("/cronjobs") else "leases"
        namespace = path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None
        items = [
            item
            for item in self.server.objects[kind]
            if namespace is None or item["metadata"]["namespace"] == namespace
        ]
        self.reply(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items})

    def reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    server = FakeApi(("127.0.0.1", 0), Handler)
    server.objects = {"cronjobs": [], "leases": []}
    server.paths = []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def reachable(tmp_path: Path, fake_api: FakeApi) -> Path:
    host, port = fake_api.server_address[:2]
    return kubeconfig(tmp_path / "config", f"http://{host!s}:{port}", namespace="team-a")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = status.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_no_subcommand_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)

    assert code == 2
    assert "status" in err
    assert out == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--bogus"],
        ["status", "-o", "xml"],
        ["status", "-n", "a", "-A"],
        ["status", "-n"],
        ["stauts"],
    ],
)
def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        status.main(argv)

    assert exited.value.code == 2
    assert "error" in capsys.readouterr().err


def test_a_kubeconfig_that_does_not_exist_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nope"

    code, _, err = run(capsys, "status", "--kubeconfig", str(missing))

    assert code == 2
    assert str(missing) in err


def test_an_unknown_context_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], unreachable: Path
) -> None:
    code, _, err = run(capsys, "status", "--kubeconfig", str(unreachable), "--context", "prod")

    assert code == 2
    assert "prod" in err


def test_an_unreachable_api_server_exits_69_naming_the_server_and_the_request(
    capsys: pytest.CaptureFixture[str], unreachable: Path, closed_port: int
) -> None:
    code, out, err = run(capsys, "status", "--kubeconfig", str(unreachable))

    assert code == 69
    assert out == ""
    # The namespace came from the kubeconfig's current context.
    assert "cannot list cronjobs.batch in namespace team-a" in err
    assert f"127.0.0.1:{closed_port}" in err
    assert "unreachable" in err


def test_kubeconfig_comes_from_the_environment_like_kubectl(
    capsys: pytest.CaptureFixture[str], unreachable: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(unreachable))
    # The kubernetes client reads KUBECONFIG when it is imported.
    monkeypatch.setattr(
        "kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(unreachable)
    )

    code, _, err = run(capsys, "status", "-A")

    assert code == 69
    assert "cannot list cronjobs.batch in all namespaces" in err


def test_without_a_namespace_in_the_context_the_default_namespace_is_shown(
    capsys: pytest.CaptureFixture[str], unreachable: Path
) -> None:
    code, _, err = run(capsys, "status", "--kubeconfig", str(unreachable), "--context", "other")

    assert code == 69
    assert "in namespace default" in err


def test_a_forbidden_list_exits_69_with_the_servers_reason(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.refuse = 403

    code, _, err = run(capsys, "status", "--kubeconfig", str(reachable))

    assert code == 69
    assert "cannot list cronjobs.batch in namespace team-a: forbidden:" in err
    assert 'User "jane" cannot list resource "cronjobs"' in err


def test_the_table_and_warnings_for_a_namespace_with_an_expired_lock(
    capsys: pytest.CaptureFixture[str],
    reachable: Path,
    fake_api: FakeApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_api.objects["cronjobs"] = [
        cronjob("report", "team-a"),
        cronjob("stuck", "team-a"),
        cronjob("elsewhere", "team-b"),
    ]
    fake_api.objects["leases"] = [
        lease("report", "team-a", holder="report-1-aaaaa_0001", renewed_ago=-(10**7)),
        lease("stuck", "team-a", holder="stuck-1-bbbbb_0002", renewed_ago=3600),
    ]
    monkeypatch.delenv("COLUMNS", raising=False)

    code, out, err = run(capsys, "status", "--kubeconfig", str(reachable))

    assert code == 1
    header, *body = out.splitlines()
    assert header.split()[:3] == ["CRONJOB", "LOCK", "HOLDER"]
    assert [line.split()[:3] for line in body] == [
        ["report", "report", "report-1-aaaaa_0001"],
        ["stuck", "stuck", "stuck-1-bbbbb_0002"],
    ]
    assert "expired" in body[1]
    assert "warning: lease team-a/cronlock-stuck expired" in err
    assert "still held by stuck-1-bbbbb_0002" in err


def test_columns_follow_the_terminal_width(
    capsys: pytest.CaptureFixture[str],
    reachable: Path,
    fake_api: FakeApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("nightly-report-export", "team-a")]
    fake_api.objects["leases"] = [
        lease(
            "nightly-report-export",
            "team-a",
            holder="nightly-report-export-29123456-x7k2p_4f0e9a1c2b3d4e5f",
            renewed_ago=-(10**7),
        )
    ]
    monkeypatch.setenv("COLUMNS", "60")

    code, out, _ = run(capsys, "status", "--kubeconfig", str(reachable))

    assert code == 0
    assert "…" in out
    assert all(len(line) <= 60 for line in out.splitlines()), out


def test_json_output_and_all_namespaces(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [
        cronjob("report", "team-a"),
        cronjob("elsewhere", "team-b", skips=5),
        cronjob("plain", "team-b", enabled=None),
    ]

    code, out, err = run(capsys, "status", "--kubeconfig", str(reachable), "-A", "-o", "json")

    assert code == 1
    document = json.loads(out)
    assert (document["apiVersion"], document["kind"]) == ("v1", "List")
    items = document["items"]
    assert [(entry["namespace"], entry["cronjob"], entry["state"]) for entry in items] == [
        ("team-a", "report", "missing"),
        ("team-b", "elsewhere", "missing"),
    ]
    assert items[1]["consecutiveSkips"] == 5
    assert "skipped 5 consecutive runs" in err


def test_an_empty_namespace_says_so_on_stderr_and_is_fine(
    capsys: pytest.CaptureFixture[str], reachable: Path
) -> None:
    code, out, err = run(capsys, "status", "--kubeconfig", str(reachable), "-n", "empty")

    assert code == 0
    assert out == ""
    assert "No guarded CronJobs" in err
    assert "namespace empty" in err


def test_watch_redraws_until_ctrl_c_and_then_exits_0(
    capsys: pytest.CaptureFixture[str],
    reachable: Path,
    fake_api: FakeApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("report", "team-a")]
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt
        # The API goes away between redraws: the watch shows it and carries on.
        fake_api.refuse = 503

    monkeypatch.setattr(status, "_pause", sleep)

    code, out, _ = run(capsys, "status", "--kubeconfig", str(reachable), "--watch")

    assert code == 0
    assert naps == [2.0, 2.0]
    assert out.count("Every 2s:") == 2
    assert "report" in out
    assert "cannot list cronjobs.batch in namespace team-a: refused" in out


def test_watch_as_json_writes_one_list_per_line_and_errors_to_stderr(
    capsys: pytest.CaptureFixture[str],
    reachable: Path,
    fake_api: FakeApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("report", "team-a")]
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt
        fake_api.refuse = 503 if len(naps) == 1 else None

    monkeypatch.setattr(status, "_pause", sleep)

    code, out, err = run(capsys, "status", "--kubeconfig", str(reachable), "--watch", "-o", "json")

    assert code == 0
    lines = [json.loads(line)["items"] for line in out.splitlines()]
    assert [[entry["cronjob"] for entry in items] for items in lines] == [
        ["report"],
        ["report"],
    ]
    assert "cannot list cronjobs.batch in namespace team-a: refused" in err


def test_name_output_and_no_headers(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("report", "team-a"), cronjob("export", "team-a")]

    code, out, _ = run(capsys, "status", "--kubeconfig", str(reachable), "-o", "name")
    assert code == 0
    assert out.splitlines() == ["cronjob.batch/export", "cronjob.batch/report"]

    code, out, _ = run(capsys, "status", "--kubeconfig", str(reachable), "--no-headers")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["export", "report"]


def test_the_selector_goes_to_the_api_server(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("report", "team-a")]
    code, _, _ = run(capsys, "status", "--kubeconfig", str(reachable), "-l", "team=billing")
    assert code == 0
    assert any("labelSelector=team%3Dbilling" in path for path in fake_api.paths)


@pytest.mark.parametrize(
    "content",
    ["clusters: [unclosed", "- just\n- a list\n", "apiVersion: v1\nkind: Config\nclusters: 7\n"],
)
def test_a_malformed_kubeconfig_is_a_usage_error_without_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str
) -> None:
    broken = tmp_path / "broken"
    broken.write_text(content)
    code, out, err = run(capsys, "status", "--kubeconfig", str(broken))
    assert code == 2
    assert out == ""
    assert err.startswith("cronlock: error: kubeconfig")
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["soon", "0s", "-1s"])
def test_a_bad_request_timeout_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], reachable: Path, value: str
) -> None:
    code, _, err = run(
        capsys, "status", "--kubeconfig", str(reachable), f"--request-timeout={value}"
    )
    assert code == 2
    assert "--request-timeout" in err


def test_a_closed_pipe_ends_quietly(reachable: Path, fake_api: FakeApi) -> None:
    fake_api.objects["cronjobs"] = [cronjob(f"job-{n}", "team-a") for n in range(2000)]
    script = (
        "import sys; from cronlock_operator.status.cli import main; "
        f"sys.exit(main(['status', '--kubeconfig', {str(reachable)!r}]))"
    )
    producer = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert producer.stdout is not None
    head = subprocess.run(
        ["head", "-n", "1"], stdin=producer.stdout, capture_output=True, text=True, timeout=60
    )
    producer.stdout.close()  # head has gone: the next write meets a closed pipe
    _, stderr = producer.communicate(timeout=60)
    assert head.stdout.startswith("CRONJOB")
    assert b"Traceback" not in stderr, stderr
    assert producer.returncode == 0
