"""`cronlock status` against a real API server: held, free, expired and missing Leases."""

from __future__ import annotations

import datetime
import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from cronlock_sidecar.stores.pgstore import PostgresLeaseStore
from cronlock_sidecar.stores.url import parse_store_url
from cronlock_sidecar.transport.seam import LeaseRef
from tests.support import gen
from tests.support.controlplane import ControlPlane, ServiceAccountKubeconfig
from tests.support.leases import make_lease
from tests.support.paths import ROOT

pytestmark = pytest.mark.controlplane

BIN = ROOT / ".venv" / "bin"
HOLDER = "fresh-29123456-x7k2p_4f0e9a1c"
STALE_HOLDER = "stuck-29000000-q1w2e_77aa0bb1"


# Created through the API, due every five minutes (status reads its schedule).
EVERY_FIVE_MINUTES = (gen.in_namespace(None), gen.restart_policy("Never"))


@pytest.fixture
def guarded(api: kubernetes.client.ApiClient, namespace: str) -> str:
    """fresh (held now), idle (free), stuck (held, expired an hour ago), new (no Lease),
    two CronJobs sharing the lock `shared`, and one CronJob that did not opt in."""
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_cron_job(namespace, gen.cronjob("fresh", *EVERY_FIVE_MINUTES))
    batch.create_namespaced_cron_job(namespace, gen.cronjob("idle", *EVERY_FIVE_MINUTES))
    batch.create_namespaced_cron_job(
        namespace,
        gen.cronjob(
            "stuck", *EVERY_FIVE_MINUTES, gen.annotated({"cronlock.io/consecutive-skips": "2"})
        ),
    )
    batch.create_namespaced_cron_job(namespace, gen.cronjob("new", *EVERY_FIVE_MINUTES))
    batch.create_namespaced_cron_job(
        namespace, gen.cronjob("plain", *EVERY_FIVE_MINUTES, gen.not_opted_in())
    )
    now = datetime.datetime.now(datetime.UTC)
    leases = kubernetes.client.CoordinationV1Api(api)
    # MicroTime strings (make_lease writes them as the sidecar does), never datetimes: the
    # Python client drops the fraction of a whole second, which the API server refuses.
    for lease in (
        make_lease(HOLDER, lock="fresh", namespace=namespace, renewed=now, duration=30),
        make_lease(
            lock="idle",
            namespace=namespace,
            renewed=now - datetime.timedelta(minutes=10),
            duration=30,
            annotations={
                "cronlock.io/last-holder": "idle-28999990-aaaaa_00000001",
                "cronlock.io/released-at": "2026-01-01T00:00:00.000001Z",
            },
        ),
        make_lease(
            STALE_HOLDER,
            lock="stuck",
            namespace=namespace,
            renewed=now - datetime.timedelta(hours=1),
            duration=30,
        ),
    ):
        leases.create_namespaced_lease(namespace, lease)
    return namespace


def cronlock(
    controlplane: ControlPlane, *args: str, program: str = "cronlock", columns: int | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(controlplane.env)
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [str(BIN / program), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def table(text: str) -> dict[str, list[str]]:
    """Rows by their first cell, split on the table's gaps (runs of 2+ spaces)."""
    lines = [
        [cell.strip() for cell in line.split("   ") if cell.strip()] for line in text.splitlines()
    ]
    return {line[0]: line for line in lines}


def test_the_table_shows_each_guarded_cronjob_and_exits_1_for_the_expired_lock(
    controlplane: ControlPlane, guarded: str
) -> None:
    result = cronlock(controlplane, "status", "-n", guarded)

    assert result.returncode == 1, result.stderr
    shown = table(result.stdout)
    assert shown["CRONJOB"] == [
        "CRONJOB",
        "LOCK",
        "HOLDER",
        "RENEWED",
        "EXPIRES",
        "SKIPS",
        "LAST SCHEDULE",
        "LAST SUCCESS",
        "NEXT",
    ]
    assert set(shown) == {"CRONJOB", "fresh", "idle", "stuck", "new"}
    fresh = shown["fresh"]
    assert fresh[:3] == ["fresh", "fresh", HOLDER]
    assert fresh[3].endswith("s ago")
    assert fresh[4].startswith("in ")
    assert fresh[7] == "-", "no run has succeeded yet"
    assert fresh[8].startswith("in "), "the next tick of its schedule"
    idle = shown["idle"]
    assert idle[2:5] == ["-", "10m ago", "-"]
    stuck = shown["stuck"]
    assert stuck[2] == STALE_HOLDER
    assert stuck[4].startswith("expired ")
    assert stuck[5] == "2"
    assert shown["new"][2:5] == ["missing", "-", "-"]
    assert f"lease {guarded}/cronlock-stuck expired" in result.stderr
    assert f"still held by {STALE_HOLDER}" in result.stderr


def test_json_output_is_machine_readable(controlplane: ControlPlane, guarded: str) -> None:
    result = cronlock(controlplane, "status", "-n", guarded, "-o", "json")

    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert document["kind"] == "List"
    by_name = {entry["cronjob"]: entry for entry in document["items"]}
    assert sorted(by_name) == ["fresh", "idle", "new", "stuck"]
    assert {name: entry["state"] for name, entry in by_name.items()} == {
        "fresh": "held",
        "idle": "free",
        "new": "missing",
        "stuck": "expired",
    }
    fresh = by_name["fresh"]
    assert fresh["namespace"] == guarded
    assert fresh["lease"] == "cronlock-fresh"
    assert fresh["holder"] == HOLDER
    assert 0 < fresh["expiresInSeconds"] <= 30
    renewed = datetime.datetime.fromisoformat(fresh["renewTime"].replace("Z", "+00:00"))
    assert abs(datetime.datetime.now(datetime.UTC) - renewed) < datetime.timedelta(minutes=1)
    stuck = by_name["stuck"]
    assert stuck["expiresInSeconds"] < -3500
    assert stuck["consecutiveSkips"] == 2
    assert by_name["idle"]["lastHolder"] == "idle-28999990-aaaaa_00000001"
    assert by_name["idle"]["releasedAt"] == "2026-01-01T00:00:00.000001Z"


def test_all_healthy_exits_0_and_all_namespaces_adds_the_namespace_column(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, guarded: str
) -> None:
    kubernetes.client.CoordinationV1Api(api).delete_namespaced_lease("cronlock-stuck", guarded)

    alone = cronlock(controlplane, "status", "-n", guarded)
    everywhere = cronlock(controlplane, "status", "-A")

    assert alone.returncode == 0, alone.stderr
    assert table(alone.stdout)["stuck"][2] == "missing"
    header, *lines = everywhere.stdout.splitlines()
    assert header.split()[:2] == ["NAMESPACE", "CRONJOB"]
    mine = [line.split() for line in lines if line.startswith(guarded + " ")]
    assert sorted(line[1] for line in mine) == ["fresh", "idle", "new", "stuck"]


def test_a_narrow_terminal_gets_a_table_that_fits(controlplane: ControlPlane, guarded: str) -> None:
    result = cronlock(controlplane, "status", "-n", guarded, columns=40)

    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert all(len(line) <= 40 for line in lines), result.stdout
    assert lines[0].split() == ["CRONJOB", "HOLDER", "EXPIRES"]
    assert "…" in result.stdout


def test_kubectl_finds_the_plugin_on_the_path(controlplane: ControlPlane, guarded: str) -> None:
    env = dict(controlplane.env)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"

    result = subprocess.run(
        ["kubectl", "cronlock", "status", "-n", guarded],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )

    assert result.returncode == 1, result.stderr
    assert table(result.stdout)["fresh"][2] == HOLDER


def test_the_namespace_defaults_to_the_kubeconfig_context(
    controlplane: ControlPlane, guarded: str, tmp_path: Path
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(controlplane.kubeconfig.read_text())
    env = dict(controlplane.env, KUBECONFIG=str(config))
    subprocess.run(
        ["kubectl", "config", "set-context", "--current", f"--namespace={guarded}"],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )

    result = subprocess.run(
        [str(BIN / "cronlock"), "status", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )

    assert result.returncode == 1, result.stderr
    assert {entry["namespace"] for entry in json.loads(result.stdout)["items"]} == {guarded}


def test_a_user_who_may_not_list_cronjobs_gets_69_and_what_was_refused(
    controlplane: ControlPlane,
    guarded: str,
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:
    config = service_account_kubeconfig(guarded, "nobody")

    result = cronlock(controlplane, "status", "--kubeconfig", str(config))

    assert result.returncode == 69
    assert result.stdout == ""
    assert f"cannot list cronjobs.batch in namespace {guarded}: forbidden" in result.stderr
    assert f"system:serviceaccount:{guarded}:nobody" in result.stderr


def test_watch_redraws_until_ctrl_c_and_exits_0(controlplane: ControlPlane, guarded: str) -> None:
    process = subprocess.Popen(
        [str(BIN / "cronlock"), "status", "-n", guarded, "--watch"],
        env=controlplane.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a shell without job control starts background commands
        # with SIGINT ignored, and Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    output = Output(process)
    try:
        # Interrupted once it has drawn two frames (a frame's header, then its rows), not
        # after a guess at how long two take.
        for _ in range(2):
            output.wait_for("Every 2s:", 30)
            output.wait_for(HOLDER, 10)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        output.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert process.stdout is not None
    assert process.stderr is not None
    with process.stdout, process.stderr:  # stdout read to its end by Output's thread
        err = process.stderr.read()
    assert process.returncode == 0, err
    assert "Traceback" not in err


def test_as_impersonates_a_user_whom_rbac_refuses_and_as_group_a_group_it_lets_in(
    controlplane: ControlPlane, guarded: str
) -> None:
    nobody = f"system:serviceaccount:{guarded}:nobody"

    refused = cronlock(controlplane, "status", "-n", guarded, "--as", nobody)
    admitted = cronlock(
        controlplane, "status", "-n", guarded, "--as", "jane", "--as-group", "system:masters"
    )
    alone = cronlock(controlplane, "status", "-n", guarded, "--as-group", "system:masters")

    assert refused.returncode == 69
    assert refused.stdout == ""
    assert f"cannot list cronjobs.batch in namespace {guarded}: forbidden" in refused.stderr
    assert f'User "{nobody}" cannot list' in refused.stderr
    assert admitted.returncode == 1, admitted.stderr
    assert table(admitted.stdout)["fresh"][2] == HOLDER
    assert alone.returncode == 2
    assert "--as-group needs --as" in alone.stderr


def test_token_replaces_the_admins_client_certificate(
    controlplane: ControlPlane,
    guarded: str,
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:
    config = yaml.safe_load(service_account_kubeconfig(guarded, "nobody").read_text())
    token = config["users"][0]["user"]["token"]

    result = cronlock(controlplane, "status", "-n", guarded, "--token", token)

    assert result.returncode == 69
    assert f'User "system:serviceaccount:{guarded}:nobody" cannot list' in result.stderr


def test_insecure_skip_tls_verify_reaches_a_server_whose_ca_is_unknown(
    controlplane: ControlPlane, guarded: str, tmp_path: Path
) -> None:
    config = yaml.safe_load(controlplane.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"].pop("certificate-authority", None)
        entry["cluster"].pop("certificate-authority-data", None)
    without_ca = tmp_path / "without-ca.kubeconfig"
    without_ca.write_text(yaml.safe_dump(config))

    checked = cronlock(controlplane, "status", "-n", guarded, "--kubeconfig", str(without_ca))
    unchecked = cronlock(
        controlplane,
        "status",
        "-n",
        guarded,
        "--kubeconfig",
        str(without_ca),
        "--insecure-skip-tls-verify",
    )

    assert checked.returncode == 69
    assert "CERTIFICATE_VERIFY_FAILED" in checked.stderr
    assert unchecked.returncode == 1, unchecked.stderr
    assert table(unchecked.stdout)["fresh"][2] == HOLDER
    assert "InsecureRequestWarning" not in unchecked.stderr


def test_all_namespaces_wins_over_a_namespace(controlplane: ControlPlane, guarded: str) -> None:
    result = cronlock(controlplane, "status", "-A", "-n", "kube-system")

    assert result.returncode == 1, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split()[:2] == ["NAMESPACE", "CRONJOB"]
    mine = [line.split() for line in lines if line.startswith(guarded + " ")]
    assert sorted(line[1] for line in mine) == ["fresh", "idle", "new", "stuck"]


class Output:
    """A process's stdout read a line at a time, as it comes, by a thread of its own."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stdout: Any) -> None:
        for line in stdout:
            self._lines.put(line)

    def wait_for(self, text: str, seconds: float) -> float:
        """Read until a line has `text`; how long that took. Fails after `seconds`."""
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            try:
                if text in self._lines.get(timeout=0.2):
                    return time.monotonic() - start
            except queue.Empty:
                continue
        raise AssertionError(f"{text!r} not shown within {seconds}s")

    def close(self) -> None:
        """After the process ended: the rest is read to its end."""
        self._reader.join(timeout=30)


def test_watch_shows_a_lease_change_as_it_happens(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, guarded: str
) -> None:
    newcomer = "idle-29123999-z9y8x_0badcafe"
    with subprocess.Popen(
        [str(BIN / "cronlock"), "status", "-n", guarded, "--watch"],
        env=controlplane.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as process:
        output = Output(process)
        try:
            output.wait_for(HOLDER, 30)
            claimed = make_lease(
                newcomer,
                lock="idle",
                namespace=guarded,
                renewed=datetime.datetime.now(datetime.UTC),
                duration=30,
            )
            kubernetes.client.CoordinationV1Api(api).patch_namespaced_lease(
                "cronlock-idle", guarded, {"spec": claimed["spec"]}
            )
            # Drawn from the watch event (at most a second later), not from a list.
            took = output.wait_for(newcomer, 10)
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            output.close()
        assert process.stderr is not None
        err = process.stderr.read()

    assert process.returncode == 0, err
    assert took < 5


def test_a_lock_in_redis_shows_its_holder_to_whoever_may_read_its_secret(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    redis_store: Any,
    service_account_kubeconfig: ServiceAccountKubeconfig,
    tmp_path: Path,
) -> None:
    """No Lease in the cluster: with the Secret's URL, status reads the holder from Redis;
    without the right to read the Secret, the row says in-store and a note says why."""
    batch = kubernetes.client.BatchV1Api(api)
    annotations = {
        "cronlock.io/enabled": "true",
        "cronlock.io/store": "redis",
        "cronlock.io/store-secret": "team-locks",
    }
    batch.create_namespaced_cron_job(
        namespace, gen.cronjob("ledger", *EVERY_FIVE_MINUTES, gen.with_annotations(annotations))
    )
    kubernetes.client.CoreV1Api(api).create_namespaced_secret(
        namespace, {"metadata": {"name": "team-locks"}, "stringData": {"url": redis_store.url}}
    )
    started = tmp_path / "started"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    holder = subprocess.Popen(
        [str(BIN / "cronlock-sidecar"), "run", "--lease", f"{namespace}/cronlock-ledger",
         "--identity", "vm-7_0001", "--", "sh", "-c", f"touch {started}; sleep 30"],
        env={**env, "CRONLOCK_STORE": redis_store.url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the run outside the cluster did not take the lock"

        # Stores are read only when asked: the row says in-store, one line says how.
        unread = cronlock(controlplane, "status", "-n", namespace, "-o", "json")
        assert unread.returncode == 0, unread.stderr
        (row,) = json.loads(unread.stdout)["items"]
        assert (row["store"], row["state"], row["holder"]) == ("redis", "in-store", None)
        assert "add --read-stores to read them" in unread.stderr

        result = cronlock(controlplane, "status", "-n", namespace, "-o", "json", "--read-stores")
        assert result.returncode == 0, result.stderr
        (row,) = json.loads(result.stdout)["items"]
        assert (row["store"], row["state"], row["holder"]) == ("redis", "held", "vm-7_0001")
        assert (
            f"reading {namespace}/cronlock-ledger (redis) from redis at "
            f"127.0.0.1:{redis_store.port} (Secret {namespace}/team-locks)"
        ) in result.stderr
        assert redis_store.password not in result.stdout + result.stderr

        # A reader who may list CronJobs but not read Secrets.
        config = service_account_kubeconfig(namespace, "viewer")
        rbac = kubernetes.client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "viewer"},
                "rules": [
                    {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["list"]},
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "resources": ["leases"],
                        "verbs": ["list"],
                    },
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "viewer"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "viewer",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}],
            },
        )
        limited = cronlock(
            controlplane, "status", "--kubeconfig", str(config), "-o", "json", "--read-stores"
        )
        assert limited.returncode == 0, limited.stderr
        (row,) = json.loads(limited.stdout)["items"]
        assert (row["store"], row["state"], row["holder"]) == ("redis", "in-store", None)
        assert f"you may not read Secret {namespace}/team-locks" in limited.stderr
    finally:
        holder.terminate()
        holder.communicate(timeout=30)


def test_status_never_lends_the_callers_postgres_password_to_the_secrets_host(
    controlplane: ControlPlane,
    api: kubernetes.client.ApiClient,
    namespace: str,
    postgres_store: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Security review L4. A Secret whose URL names a user but no password: with the right
    password in the caller's PGPASSWORD (or ~/.pgpass) the client as it connected before
    authenticates there; `cronlock status --read-stores` and `freeze --store-secret` do
    not (no password supplied). A URL with its own password is read as before."""
    port, password = postgres_store.port, postgres_store.password
    borrowing = f"postgresql://cronlock@127.0.0.1:{port}/cronlock"
    batch = kubernetes.client.BatchV1Api(api)
    core = kubernetes.client.CoreV1Api(api)
    for name, secret, url in (
        ("ledger", "team-locks", postgres_store.url),
        ("trap", "borrowed", borrowing),
    ):
        batch.create_namespaced_cron_job(
            namespace,
            gen.cronjob(
                name,
                *EVERY_FIVE_MINUTES,
                gen.with_annotations(
                    {
                        "cronlock.io/enabled": "true",
                        "cronlock.io/store": "postgres",
                        "cronlock.io/store-secret": secret,
                    }
                ),
            ),
        )
        core.create_namespaced_secret(
            namespace, {"metadata": {"name": secret}, "stringData": {"url": url}}
        )
    started = tmp_path / "started"
    outside = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    holder = subprocess.Popen(
        [str(BIN / "cronlock-sidecar"), "run", "--lease", f"{namespace}/cronlock-ledger",
         "--identity", "vm-7_0001", "--", "sh", "-c", f"touch {started}; sleep 60"],
        env={**outside, "CRONLOCK_STORE": postgres_store.url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    home = tmp_path / "home"
    home.mkdir()
    pgpass = home / ".pgpass"
    pgpass.write_text(f"127.0.0.1:{port}:cronlock:cronlock:{password}\n")
    pgpass.chmod(0o600)
    try:
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the run outside the cluster did not take the lock"

        ledger = LeaseRef(namespace, "cronlock-ledger")
        for lent in ({"PGPASSWORD": password}, {"HOME": str(home)}):
            # Before: the client as status and freeze connected with it (not isolated)
            # authenticates with the caller's password and reads the lock.
            with monkeypatch.context() as patch:
                for key, value in lent.items():
                    patch.setenv(key, value)
                before = PostgresLeaseStore(
                    parse_store_url(borrowing, "x"), lambda: datetime.datetime.now(datetime.UTC),
                    create_tables=False,
                )  # fmt: skip
                try:
                    document = before.get(ledger)
                finally:
                    before.close()
            assert document["spec"]["holderIdentity"] == "vm-7_0001", lent

            result = subprocess.run(
                [str(BIN / "cronlock"), "status", "-n", namespace, "-o", "json", "--read-stores"],
                env={**controlplane.env, **lent},
                capture_output=True, text=True, check=False, timeout=60,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            rows = {row["cronjob"]: row for row in json.loads(result.stdout)["items"]}
            assert (rows["ledger"]["state"], rows["ledger"]["holder"]) == ("held", "vm-7_0001")
            assert (rows["trap"]["state"], rows["trap"]["holder"]) == ("in-store", None), lent
            assert (
                f"reading {namespace}/cronlock-trap (postgres) from postgres at "
                f"127.0.0.1:{port} (Secret {namespace}/borrowed)"
            ) in result.stderr
            (note,) = [line for line in result.stderr.splitlines() if "holder not shown" in line]
            assert f"{namespace}/cronlock-trap (postgres)" in note
            assert "no password supplied" in note, note
            assert password not in result.stdout + result.stderr

            frozen = subprocess.run(
                [str(BIN / "cronlock"), "freeze", "trap", "-n", namespace, "--store-secret",
                 "borrowed", "--for", "10m", "--reason", "borrowed password"],
                env={**controlplane.env, **lent},
                capture_output=True, text=True, check=False, timeout=60,
            )  # fmt: skip
            assert frozen.returncode == 69, frozen.stderr
            assert f"writing to postgres at 127.0.0.1:{port}" in frozen.stderr
            assert "no password supplied" in frozen.stderr
    finally:
        holder.terminate()
        holder.communicate(timeout=30)


def test_hostile_lease_strings_reach_the_terminal_escaped_and_json_exact(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, namespace: str
) -> None:
    """A last holder and a freeze's reason, stored by the API server as written (here by
    an admin; before the holders' policy, by any pod on a free Lease), come out of `-o wide`
    escaped: no ESC, BEL, C1 or bidi override reaches the terminal. `-o json` keeps them
    exact. (A freezer's name is its own username, which the freeze policy checks; a hostile
    one from a store is tests/unit/status/test_escaping.py's.)"""
    title_and_clear = "\x1b]0;owned\u202e\x9b\x07\x1b[2J"
    review = kubernetes.client.AuthenticationV1Api(api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    frozen_by = review.status.user_info.username
    now = datetime.datetime.now(datetime.UTC)
    until = (now + datetime.timedelta(hours=1)).replace(microsecond=0)
    leases = kubernetes.client.CoordinationV1Api(api)
    hostile = {
        "cronlock.io/last-holder": title_and_clear,
        "cronlock.io/released-at": "2026-01-01T00:00:00.000001Z",
        "cronlock.io/frozen-until": until.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
        "cronlock.io/frozen-by": frozen_by,
        "cronlock.io/frozen-reason": "\x1b[2J",
    }
    leases.create_namespaced_lease(
        namespace,
        make_lease(
            lock="victim",
            namespace=namespace,
            renewed=now - datetime.timedelta(minutes=10),
            annotations=hostile,
        ),
    )
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace, gen.cronjob("victim", *EVERY_FIVE_MINUTES)
    )
    stored = leases.read_namespaced_lease("cronlock-victim", namespace).metadata.annotations
    assert {key: stored[key] for key in hostile} == hostile

    wide = cronlock(controlplane, "status", "-n", namespace, "-o", "wide")

    assert wide.returncode == 0, wide.stderr
    assert [c for c in "\x1b\x07\x9b\u202e" if c in wide.stdout + wide.stderr] == []
    row = table(wide.stdout)["victim"]
    assert r"\x1b]0;owned\u202e\x9b\x07\x1b[2J" in row
    assert row[-1] == f"until {until:%Y-%m-%dT%H:%M:%S}Z by {frozen_by}"

    as_json = cronlock(controlplane, "status", "-n", namespace, "-o", "json")

    assert as_json.returncode == 0, as_json.stderr
    (item,) = json.loads(as_json.stdout)["items"]
    assert item["lastHolder"] == title_and_clear
    assert (item["frozen"]["by"], item["frozen"]["reason"]) == (frozen_by, "\x1b[2J")


def test_the_last_tick_of_each_cronjob_on_a_lock_shows_in_wide_json_and_yaml(
    controlplane: ControlPlane, api: kubernetes.client.ApiClient, namespace: str
) -> None:
    """Issue 56, every tick accounted for: the tick records a claim writes on the Lease
    (`cronlock.io/tick.<cronjob>`), one per CronJob sharing the lock, with which Job, run,
    holder and cluster worked it. A record that does not read as one (written by whoever
    may write the Lease) is not shown and breaks nothing."""
    leases = kubernetes.client.CoordinationV1Api(api)
    now = datetime.datetime.now(datetime.UTC)
    records = {
        "cronlock.io/tick.ticked": (
            "2026-12-06T12:00:00Z ticked-29416320 0c5e-uid ticked-29416320-x9k2p_0a1b east"
        ),
        "cronlock.io/tick.vm-report": "2026-12-06T11:00:00Z - vm-run-7 vm-01 -",
        "cronlock.io/tick.hostile": "2026-12-06T12:00:00Z \x1b]0;owned\x07 a b c",
        "cronlock.io/tick.far": "tomorrow a b c d",
        "cronlock.io/succeeded.ticked": (
            "2026-12-06T11:00:00Z ticked-29416260 9a1f-uid ticked-29416260-q2w3e_0a1b east"
        ),
    }
    leases.create_namespaced_lease(
        namespace,
        make_lease(
            lock="ticked",
            namespace=namespace,
            renewed=now - datetime.timedelta(minutes=1),
            annotations=records,
        ),
    )
    kubernetes.client.BatchV1Api(api).create_namespaced_cron_job(
        namespace, gen.cronjob("ticked", *EVERY_FIVE_MINUTES)
    )

    wide = cronlock(controlplane, "status", "-n", namespace, "-o", "wide")

    assert wide.returncode == 0, wide.stderr
    assert "LAST TICK" in wide.stdout.splitlines()[0]
    assert table(wide.stdout)["ticked"][-3] == (
        "2026-12-06T12:00:00Z job ticked-29416320 (run 0c5e-uid, holder "
        "ticked-29416320-x9k2p_0a1b, cluster east)"
    )
    # The last successful tick, beside it (the 12:00 tick claimed after it).
    assert table(wide.stdout)["ticked"][-2] == "2026-12-06T11:00:00Z"
    assert "\x1b" not in wide.stdout + wide.stderr

    expected = [
        {
            "cronjob": "ticked",
            "tick": "2026-12-06T12:00:00Z",
            "job": "ticked-29416320",
            "run": "0c5e-uid",
            "holder": "ticked-29416320-x9k2p_0a1b",
            "cluster": "east",
        },
        {
            "cronjob": "vm-report",
            "tick": "2026-12-06T11:00:00Z",
            "job": None,
            "run": "vm-run-7",
            "holder": "vm-01",
            "cluster": None,
        },
    ]
    for output, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        result = cronlock(controlplane, "status", "-n", namespace, "-o", output)
        assert result.returncode == 0, result.stderr
        (item,) = load(result.stdout)["items"]
        assert item["ticks"] == expected, output
        assert [success["tick"] for success in item["successes"]] == ["2026-12-06T11:00:00Z"]
