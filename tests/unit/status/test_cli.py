"""`cronlock status` as a command: flags, namespaces, exit codes and messages, over a fake API."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from cronlock_operator.status import api
from cronlock_operator.status import cli as status
from cronlock_sidecar import contract
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
    """Answers list requests for CronJobs and Leases from `objects`, or with `refuse`; at
    most `page` items a response when set (the rest behind a `continue` token)."""

    objects: dict[str, list[dict[str, Any]]]
    refuse: int | None = None
    # Refuse only the list of namespaces, with this code.
    refuse_namespaces: int | None = None
    page: int | None = None
    paths: list[str]
    headers: list[Message]


class Handler(http.server.BaseHTTPRequestHandler):
    server: FakeApi

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        self.server.headers.append(self.headers)
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
        if path == "/api/v1/namespaces":
            self.namespaces()
            return
        kind = "cronjobs" if path.endswith("/cronjobs") else "leases"
        namespace = path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None
        items = [
            item
            for item in self.server.objects[kind]
            if namespace is None or item["metadata"]["namespace"] == namespace
        ]
        query = parse_qs(urlsplit(self.path).query)
        start = int(query.get("continue", ["0"])[0])
        end = len(items) if self.server.page is None else start + self.server.page
        metadata = {"resourceVersion": "7"}
        if end < len(items):
            metadata["continue"] = str(end)
        self.reply(
            200,
            {"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": items[start:end]},
        )

    def namespaces(self) -> None:
        """The namespaces whose labels match every `key=value` of the labelSelector."""
        if self.server.refuse_namespaces is not None:
            code = self.server.refuse_namespaces
            self.reply(code, {"kind": "Status", "status": "Failure", "code": code})
            return
        query = parse_qs(urlsplit(self.path).query)
        wanted = dict(term.split("=", 1) for term in query["labelSelector"][0].split(","))
        items = [
            item
            for item in self.server.objects.get("namespaces", [])
            if wanted.items() <= item["metadata"].get("labels", {}).items()
        ]
        self.reply(200, {"kind": "NamespaceList", "metadata": {}, "items": items})

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
    server.headers = []
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
    [["--version"], ["status", "--version"], ["lint", "--version"], ["freeze", "--version"],
     ["unfreeze", "--version"]],
)  # fmt: skip
def test_every_command_says_its_version(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        status.main(argv)
    assert exited.value.code == 0
    command = " ".join(["cronlock", *argv[:-1]])
    assert capsys.readouterr().out == f"{command} {contract.VERSION}\n"


@pytest.mark.parametrize("program", ["cronlock-sidecar", "cronlock-operator"])
def test_the_sidecar_and_the_operator_say_their_version(program: str) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / program), "--version"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, f"{program} {contract.VERSION}\n"), done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--bogus"],
        ["status", "-o", "xml"],
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


def test_all_namespaces_wins_over_a_namespace_like_kubectl(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("report", "team-a"), cronjob("export", "team-b")]

    code, out, _ = run(
        capsys, "status", "--kubeconfig", str(reachable), "-A", "-n", "team-a", "-o", "json"
    )

    assert code == 0
    shown = [(item["namespace"], item["cronjob"]) for item in json.loads(out)["items"]]
    assert shown == [("team-a", "report"), ("team-b", "export")]
    assert fake_api.paths[0].startswith("/apis/batch/v1/cronjobs?")


def test_lists_come_in_pages_and_only_cronlocks_leases_are_asked_for(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [cronjob(f"job-{n}", "team-a") for n in range(3)]
    fake_api.objects["leases"] = [
        lease(f"job-{n}", "team-a", holder=f"job-{n}-aaaaa_0001", renewed_ago=-(10**7))
        for n in range(3)
    ]
    fake_api.page = 2

    code, out, _ = run(capsys, "status", "--kubeconfig", str(reachable), "-o", "json")

    assert code == 0
    items = json.loads(out)["items"]
    assert [(item["cronjob"], item["state"]) for item in items] == [
        ("job-0", "held"),
        ("job-1", "held"),
        ("job-2", "held"),
    ]
    queries = [parse_qs(urlsplit(path).query) for path in fake_api.paths]
    assert [query.get("continue") for query in queries] == [None, ["2"], None, ["2"]]
    assert all(query["limit"] == [str(api.PAGE_SIZE)] for query in queries)
    lease_queries = [
        query for path, query in zip(fake_api.paths, queries, strict=True) if "/leases" in path
    ]
    assert [query["labelSelector"] for query in lease_queries] == [
        ["app.kubernetes.io/managed-by=cronlock"]
    ] * 2


def labelled(name: str) -> dict[str, Any]:
    labels = {"cronlock.io/enabled": "true", "kubernetes.io/metadata.name": name}
    return {"metadata": {"name": name, "labels": labels}}


def test_a_labelled_namespace_guards_its_unannotated_cronjobs_but_not_one_opted_out(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [
        cronjob("annotated", "team-a"),
        cronjob("by-label", "team-a", enabled=None, service_account="reports"),
        # The label alone declines the account every other pod runs as (review N4).
        cronjob("on-default", "team-a", enabled=None),
        cronjob("opted-out", "team-a", enabled="false"),
        cronjob("elsewhere", "team-b", enabled=None, service_account="reports"),
    ]
    fake_api.objects["namespaces"] = [labelled("team-a")]

    code, out, _ = run(capsys, "status", "--kubeconfig", str(reachable), "-A", "-o", "json")

    assert code == 0
    guarded = [(item["cronjob"], item["guardedBy"]) for item in json.loads(out)["items"]]
    assert guarded == [("annotated", "annotation"), ("by-label", "namespace")]
    [selector] = [
        parse_qs(urlsplit(path).query)["labelSelector"]
        for path in fake_api.paths
        if path.startswith("/api/v1/namespaces?")
    ]
    assert selector == ["cronlock.io/enabled=true"]


def test_credentials_that_may_not_read_namespaces_show_the_annotated_and_say_so(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [
        cronjob("annotated", "team-a"),
        cronjob("by-label", "team-a", enabled=None),
    ]
    fake_api.objects["namespaces"] = [labelled("team-a")]
    fake_api.refuse_namespaces = 403

    code, out, err = run(capsys, "status", "--kubeconfig", str(reachable), "-o", "json")

    assert code == 0
    assert [item["cronjob"] for item in json.loads(out)["items"]] == ["annotated"]
    assert "cannot read namespaces (forbidden)" in err
    assert "namespace's label" in err


def test_without_guarded_cronjobs_no_lease_is_listed(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("plain", "team-a", enabled=None)]

    code, _, err = run(capsys, "status", "--kubeconfig", str(reachable))

    assert code == 0
    assert "No guarded CronJobs" in err
    assert not any("/leases" in path for path in fake_api.paths)


def test_as_and_as_group_send_kubectls_impersonation_headers(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("report", "team-a")]

    code, _, _ = run(
        capsys,
        "status",
        "--kubeconfig",
        str(reachable),
        "--as",
        "jane",
        "--as-group",
        "auditors",
        "--as-group",
        "oncall",
    )

    assert code == 0
    assert len(fake_api.headers) == 2  # the CronJobs, then the Leases
    for headers in fake_api.headers:
        assert headers.get_all("Impersonate-User") == ["jane"]
        assert headers.get_all("Impersonate-Group") == ["auditors", "oncall"]
        assert headers["Authorization"] == "Bearer t"  # the admin's own credentials


def test_without_as_nothing_is_impersonated(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    code, _, _ = run(capsys, "status", "--kubeconfig", str(reachable))

    assert code == 0
    assert fake_api.headers[0].get("Impersonate-User") is None


def test_token_replaces_the_kubeconfig_users_credentials(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    code, _, _ = run(capsys, "status", "--kubeconfig", str(reachable), "--token", "s3cret")

    assert code == 0
    assert fake_api.headers[0].get_all("Authorization") == ["Bearer s3cret"]


def test_server_replaces_the_kubeconfig_clusters_address(
    capsys: pytest.CaptureFixture[str], unreachable: Path, fake_api: FakeApi
) -> None:
    host, port = fake_api.server_address[:2]
    fake_api.objects["cronjobs"] = [cronjob("report", "team-a")]

    code, out, err = run(
        capsys, "status", "--kubeconfig", str(unreachable), "--server", f"http://{host!s}:{port}"
    )

    assert code == 0, err
    assert out.splitlines()[1].split()[0] == "report"


def two_of_each(path: Path, good: str, bad: str) -> Path:
    """A kubeconfig whose current context points at `bad` as `stranger`; the `good`
    cluster and the `admin` user are there to be chosen with --cluster and --user."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "bad", "cluster": {"server": bad}},
                    {"name": "good", "cluster": {"server": good}},
                ],
                "users": [
                    {"name": "stranger", "user": {"token": "stranger-token"}},
                    {"name": "admin", "user": {"token": "admin-token"}},
                ],
                "contexts": [
                    {
                        "name": "work",
                        "context": {"cluster": "bad", "user": "stranger", "namespace": "team-a"},
                    }
                ],
                "current-context": "work",
            }
        )
    )
    return path


def test_user_and_cluster_choose_kubeconfig_entries_and_keep_the_contexts_namespace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_api: FakeApi, closed_port: int
) -> None:
    host, port = fake_api.server_address[:2]
    config = two_of_each(
        tmp_path / "config", f"http://{host!s}:{port}", f"http://127.0.0.1:{closed_port}"
    )

    code, _, err = run(
        capsys, "status", "--kubeconfig", str(config), "--cluster", "good", "--user", "admin"
    )

    assert code == 0, err
    assert fake_api.paths[0].startswith("/apis/batch/v1/namespaces/team-a/cronjobs")
    assert fake_api.headers[0]["Authorization"] == "Bearer admin-token"

    code, _, err = run(capsys, "status", "--kubeconfig", str(config), "--cluster", "good")

    assert code == 0, err
    assert fake_api.headers[-1]["Authorization"] == "Bearer stranger-token"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--as-group", "auditors"], "--as-group needs --as"),
        (["--user", "nobody"], "--user nobody: the kubeconfig has no user of that name"),
        (["--cluster", "prod"], "--cluster prod: the kubeconfig has no cluster of that name"),
        (["--server", "ftp://example.invalid"], "--server 'ftp://example.invalid'"),
        (["--server", "https://"], "--server 'https://'"),
    ],
)
def test_flags_that_cannot_work_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], reachable: Path, flags: list[str], message: str
) -> None:
    code, out, err = run(capsys, "status", "--kubeconfig", str(reachable), *flags)

    assert code == 2
    assert out == ""
    assert err.startswith(f"cronlock: error: {message}"), err
    assert len(err.splitlines()) == 1


def test_user_without_any_kubeconfig_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    missing = tmp_path / "no-such-kubeconfig"
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(missing))

    code, _, err = run(capsys, "status", "--user", "admin")

    assert code == 2
    assert f"--user names a kubeconfig entry, and there is no kubeconfig ({missing})" in err


def test_a_server_given_as_host_and_port_is_spoken_to_over_tls(
    capsys: pytest.CaptureFixture[str], unreachable: Path, closed_port: int
) -> None:
    code, _, err = run(
        capsys, "status", "--kubeconfig", str(unreachable), "-s", f"127.0.0.1:{closed_port}"
    )

    assert code == 69
    assert f"API server https://127.0.0.1:{closed_port} unreachable" in err


def test_a_hostile_holder_is_escaped_in_the_table_and_warning_and_exact_in_json(
    capsys: pytest.CaptureFixture[str], reachable: Path, fake_api: FakeApi
) -> None:
    fake_api.objects["cronjobs"] = [cronjob("stuck", "team-a")]
    fake_api.objects["leases"] = [
        lease(
            "stuck",
            "team-a",
            holder="\x1b[31mstuck\u202egpj.exe",
            renewed_ago=3600,
            annotations={"cronlock.io/last-holder": "\x1b]0;owned\x07\x1b[2J"},
        )
    ]

    code, out, err = run(capsys, "status", "--kubeconfig", str(reachable), "-o", "wide")

    assert code == 1
    assert "\x1b" not in out + err
    assert "\u202e" not in out + err
    assert r"\x1b]0;owned\x07\x1b[2J" in out.splitlines()[1].split()
    assert r"still held by \x1b[31mstuck\u202egpj.exe" in err

    code, out, _ = run(capsys, "status", "--kubeconfig", str(reachable), "-o", "json")

    assert code == 1
    [item] = json.loads(out)["items"]
    assert (item["holder"], item["lastHolder"]) == (
        "\x1b[31mstuck\u202egpj.exe",
        "\x1b]0;owned\x07\x1b[2J",
    )
