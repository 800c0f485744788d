"""Start and stop a real local Kubernetes control plane (etcd, kube-apiserver, controllers).

Standard library only, so `tests/controlplane/up` works before any virtualenv exists.
The processes run in the background on loopback ports; their pids, logs, certificates
and the admin kubeconfig live in the test environment directory
(`$CRONLOCK_TESTENV_DIR`, default `.testenv/` at the repository root).

With CRONLOCK_CONTROLPLANE_HA=1, `up` starts the control plane as production runs it: a
3-member etcd and two API servers behind a TCP balancer (relay.py), which the kubeconfig
names. The second API server reaches each etcd member through a relay of its own
(`etcd-link-N`), so a test can cut that API server from etcd alone. `ha.json` names the
ports; `components` lists what runs, in start order.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONTROLLERS = ",".join(
    [
        "cronjob-controller",
        "job-controller",
        "garbage-collector-controller",
        "serviceaccount-controller",
        "namespace-controller",
        "root-ca-certificate-publisher-controller",
        "ttl-after-finished-controller",
        "clusterrole-aggregation-controller",
        # For the real node (tests/controlplane/node): marks it Ready/NotReady and
        # taints it when its kubelet stops reporting. Idle while there is no Node.
        "node-lifecycle-controller",
        # With more than one node (tests/e2e/test_fleet.py, the pod checker's fleet
        # faults): pods of a deleted Node are deleted, as are pods on a node tainted
        # unreachable past their toleration, as in a real cluster.
        "pod-garbage-collector-controller",
        "taint-eviction-controller",
        # The chart's operator as a pod (a Deployment) and its metrics Service's
        # EndpointSlices, which `helm test` scrapes (tests/e2e/test_chart_on_node.py).
        "deployment-controller",
        "replicaset-controller",
        "endpointslice-controller",
        # ResourceQuota status, which quota admission enforces
        # (tests/integration/test_sidecar_settings.py).
        "resourcequota-controller",
    ]
)
# Service ClusterIPs come from TEST-NET-3 (RFC 5737, documentation only), never a
# private range; the `kubernetes` Service gets the first one. The real node relays
# that address to this API server (tests/controlplane/node.py).
SERVICE_CIDR = "203.0.113.0/25"  # the top half is node 2's pods (node.py)
KUBERNETES_SERVICE_IP = "203.0.113.1"
# The host's end of the link to the real node's network namespace (TEST-NET-2); the
# node's kubelet reaches this API server there. (Not TEST-NET-1: sandboxes like ours
# use 192.0.2.0/24 for their own uplink.)
NODE_LINK_HOST_IP = "198.51.100.1"
# The host's end of the second node's link (a fleet of two, tests/controlplane/node.py).
NODE2_LINK_HOST_IP = "198.51.100.5"
# ... and of nodes 3 and 4, each a control plane's own (`node up --cluster`, two clusters).
NODE3_LINK_HOST_IP = "198.51.100.9"
NODE4_LINK_HOST_IP = "198.51.100.13"
# ... and of node 5, the second e2e ring's own cluster (tests/rings.py "e2e-b").
NODE5_LINK_HOST_IP = "198.51.100.17"
READY_TIMEOUT = 120.0
CLASSIC = ("etcd", "kube-apiserver", "kube-controller-manager")
ETCD_MEMBERS = ("etcd-1", "etcd-2", "etcd-3")
APISERVERS = ("kube-apiserver-1", "kube-apiserver-2")
LINKS = tuple(f"etcd-link-{number}" for number in range(1, len(ETCD_MEMBERS) + 1))
HA_COMPONENTS = (*ETCD_MEMBERS, *LINKS, *APISERVERS, "balancer", "kube-controller-manager")


def testenv_dir() -> Path:
    return Path(os.environ.get("CRONLOCK_TESTENV_DIR", ROOT / ".testenv")).resolve()


def free_port() -> int:
    """A port free now, below the ephemeral range so no outgoing connection takes it first.

    The rule of tests/support/ports.py, kept here because this script is standard library
    only and runs outside the tests' package.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = range(max(1024, low - 10000), low)
    for _ in range(200):
        port = random.choice(ports)  # noqa: S311 - spreading picks, not a secret
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port below {low} after 200 tries")


def build_bin_dir() -> Path:
    """The directory with the pinned binaries, building them on first use."""
    out = subprocess.run(
        [str(HERE / "build")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def binaries() -> dict[str, Path]:
    """Where each binary comes from: KUBEBUILDER_ASSETS wins for the ones it holds."""
    built = build_bin_dir()
    found = {
        name: built / name
        for name in ("kube-apiserver", "kube-controller-manager", "kubectl", "etcd", "helm")
    }
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        for name in ("kube-apiserver", "etcd", "kubectl"):
            candidate = Path(assets) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                found[name] = candidate
    return found


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    """A throwaway CA, the API server's serving cert, an admin client cert, SA keys."""
    if (pki / "admin.crt").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "3650",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
        "-subj",
        "/CN=cronlock-test-ca",
    )
    ext = pki / "server.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        f"IP:{KUBERNETES_SERVICE_IP},IP:{NODE_LINK_HOST_IP},IP:{NODE2_LINK_HOST_IP},"
        f"IP:{NODE3_LINK_HOST_IP},IP:{NODE4_LINK_HOST_IP},IP:{NODE5_LINK_HOST_IP}\n"
        "extendedKeyUsage=serverAuth\n"
    )
    for name, subject, extfile in (
        ("server", "/CN=kube-apiserver", ext),
        ("admin", "/O=system:masters/CN=cronlock-admin", None),
        ("controller-manager", "/CN=system:kube-controller-manager", None),
    ):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(pki / f"{name}.key"),
            "-out",
            str(pki / f"{name}.csr"),
            "-subj",
            subject,
        )
        cmd = [
            "x509",
            "-req",
            "-in",
            str(pki / f"{name}.csr"),
            "-CA",
            str(pki / "ca.crt"),
            "-CAkey",
            str(pki / "ca.key"),
            "-CAcreateserial",
            "-days",
            "3650",
            "-out",
            str(pki / f"{name}.crt"),
        ]
        if extfile is not None:
            cmd += ["-extfile", str(extfile)]
        openssl(*cmd)
    openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def write_kubeconfig(
    path: Path, server: str, pki: Path, user: str, cert_dir: Path | None = None
) -> None:
    """A kubeconfig with file references (kept simple; every client here reads them).

    The client certificate is `<cert_dir or pki>/<user>.crt` (and `.key`).
    """
    certs = pki if cert_dir is None else cert_dir
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "cronlock-test",
                        "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
                    }
                ],
                "users": [
                    {
                        "name": user,
                        "user": {
                            "client-certificate": str(certs / f"{user}.crt"),
                            "client-key": str(certs / f"{user}.key"),
                        },
                    }
                ],
                "contexts": [
                    {
                        "name": "cronlock-test",
                        "context": {
                            "cluster": "cronlock-test",
                            "user": user,
                            "namespace": "default",
                        },
                    }
                ],
                "current-context": "cronlock-test",
            },
            indent=2,
        )
    )
    path.chmod(0o600)


def start(name: str, argv: list[str], env_dir: Path, env: dict[str, str] | None = None) -> int:
    logs = env_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    (env_dir / f"{name}.pid").write_text(str(process.pid))
    return process.pid


def wait_ready(url: str, pki: Path, name: str, env_dir: Path) -> None:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    deadline = time.monotonic() + READY_TIMEOUT
    last = ""
    while time.monotonic() < deadline:
        if not alive(env_dir, name):
            raise SystemExit(f"up: {name} exited; see {env_dir / 'logs' / (name + '.log')}")
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as response:  # noqa: S310
                if response.status == 200:
                    return
        except OSError as error:
            last = str(error)
        time.sleep(0.25)
    raise SystemExit(f"up: {name} not ready after {READY_TIMEOUT:.0f}s ({last})")


def wait_etcd(port: int, env_dir: Path, name: str = "etcd") -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if not alive(env_dir, name):
            raise SystemExit(f"up: {name} exited; see {env_dir / 'logs' / (name + '.log')}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if b'"true"' in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("up: etcd not healthy in time")


def pid_of(env_dir: Path, name: str) -> int | None:
    try:
        return int((env_dir / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None


def alive(env_dir: Path, name: str) -> bool:
    pid = pid_of(env_dir, name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of ours still answers kill(0); check its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def up() -> dict[str, str]:
    env_dir = testenv_dir()
    env_dir.mkdir(parents=True, exist_ok=True)
    kubeconfig = env_dir / "kubeconfig"
    bins = binaries()
    bin_dir = env_dir / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("kubectl", "helm"):
        link = bin_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(bins[name])
    exports = {
        "KUBECONFIG": shlex.quote(str(kubeconfig)),
        "PATH": f"{shlex.quote(str(bin_dir))}:$PATH",
    }
    ha = os.environ.get("CRONLOCK_CONTROLPLANE_HA") == "1"
    wanted = list(HA_COMPONENTS if ha else CLASSIC)
    if (
        kubeconfig.exists()
        and running_components(env_dir) == wanted
        and all(alive(env_dir, name) for name in wanted)
    ):
        return exports

    down(quiet=True)
    pki = env_dir / "pki"
    make_pki(pki)
    (env_dir / "components").write_text("\n".join(wanted) + "\n")
    server = up_ha(env_dir, bins, pki) if ha else up_one(env_dir, bins, pki)
    write_kubeconfig(kubeconfig, server, pki, "admin")

    cm_kubeconfig = env_dir / "controller-manager.kubeconfig"
    write_kubeconfig(cm_kubeconfig, server, pki, "controller-manager")
    start(
        "kube-controller-manager",
        [
            str(bins["kube-controller-manager"]),
            f"--kubeconfig={cm_kubeconfig}",
            f"--authentication-kubeconfig={cm_kubeconfig}",
            f"--authorization-kubeconfig={cm_kubeconfig}",
            f"--controllers={CONTROLLERS}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={env_dir / 'controller-manager-certs'}",
            "--concurrent-cron-job-syncs=5",
            "--concurrent-job-syncs=5",
            "--v=1",
        ],
        env_dir,
    )
    wait_default_service_account(bins["kubectl"], kubeconfig, env_dir)
    return exports


def running_components(env_dir: Path) -> list[str]:
    """What `up` started in `env_dir`, in start order (the classic three if it did not say)."""
    try:
        return (env_dir / "components").read_text().split()
    except OSError:
        return list(CLASSIC)


def start_etcd(
    env_dir: Path, bins: dict[str, Path], name: str, client: int, peer: int, cluster: str
) -> None:
    data = env_dir / f"{name}-data"
    shutil.rmtree(data, ignore_errors=True)
    start(
        name,
        [
            str(bins["etcd"]),
            *(["--name", name] if name != "etcd" else []),
            "--data-dir", str(data),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--unsafe-no-fsync",
            "--log-level", "warn",
        ],
        env_dir,
    )  # fmt: skip


def start_apiserver(
    env_dir: Path, bins: dict[str, Path], pki: Path, name: str, port: int, etcd: list[int]
) -> str:
    """The API server `name` on `port`, on the etcd client ports `etcd`; its URL."""
    servers = ",".join(f"http://127.0.0.1:{client}" for client in etcd)
    start(
        name,
        [
            str(bins["kube-apiserver"]),
            f"--etcd-servers={servers}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={pki / 'server.crt'}",
            f"--tls-private-key-file={pki / 'server.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Logs, exec and port-forward reach the real node's kubelet with this.
            f"--kubelet-client-certificate={pki / 'admin.crt'}",
            f"--kubelet-client-key={pki / 'admin.key'}",
            # By address, never by the node's name (no lookup leaves this machine).
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            # One address for every API server here: no endpoints to reconcile.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={env_dir / (name + '-certs')}",
            "--v=1",
        ],
        env_dir,
    )
    return f"https://127.0.0.1:{port}"


def up_one(env_dir: Path, bins: dict[str, Path], pki: Path) -> str:
    """One etcd member and one API server; the API server's URL."""
    etcd_port, peer_port = free_port(), free_port()
    start_etcd(env_dir, bins, "etcd", etcd_port, peer_port, f"default=http://127.0.0.1:{peer_port}")
    wait_etcd(etcd_port, env_dir)
    server = start_apiserver(env_dir, bins, pki, "kube-apiserver", free_port(), [etcd_port])
    wait_ready(f"{server}/readyz", pki, "kube-apiserver", env_dir)
    return server


def up_ha(env_dir: Path, bins: dict[str, Path], pki: Path) -> str:
    """Three etcd members, two API servers (the second through links to etcd) and the
    balancer in front; the balancer's URL. The ports go to ha.json."""
    members = {name: (free_port(), free_port()) for name in ETCD_MEMBERS}
    cluster = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, (_, peer) in members.items())
    for name, (client, peer) in members.items():
        start_etcd(env_dir, bins, name, client, peer, cluster)
    for name, (client, _) in members.items():
        wait_etcd(client, env_dir, name)
    relay = [sys.executable, str(HERE / "relay.py")]
    links = {}
    for link, (client, _) in zip(LINKS, members.values(), strict=True):
        links[link] = free_port()
        start(link, [*relay, "127.0.0.1", str(links[link]), "127.0.0.1", str(client)], env_dir)
    direct = [client for client, _ in members.values()]
    apiservers = {name: free_port() for name in APISERVERS}
    first, second = APISERVERS
    start_apiserver(env_dir, bins, pki, first, apiservers[first], direct)
    start_apiserver(env_dir, bins, pki, second, apiservers[second], list(links.values()))
    for name, port in apiservers.items():
        wait_ready(f"https://127.0.0.1:{port}/readyz", pki, name, env_dir)
    balancer = free_port()
    targets = [word for port in apiservers.values() for word in ("127.0.0.1", str(port))]
    start("balancer", [*relay, "127.0.0.1", str(balancer), *targets], env_dir)
    server = f"https://127.0.0.1:{balancer}"
    wait_ready(f"{server}/readyz", pki, "balancer", env_dir)
    ports = {
        "etcd": {name: client for name, (client, _) in members.items()},
        "links": links,
        "apiservers": apiservers,
        "balancer": balancer,
    }
    (env_dir / "ha.json").write_text(json.dumps(ports, indent=2) + "\n")
    return server


def wait_default_service_account(kubectl: Path, kubeconfig: Path, env_dir: Path) -> None:
    """The ServiceAccount controller is up once `default` exists in `default`."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if not alive(env_dir, "kube-controller-manager"):
            raise SystemExit(
                "up: kube-controller-manager exited; see "
                + str(env_dir / "logs" / "kube-controller-manager.log")
            )
        result = subprocess.run(
            [
                str(kubectl),
                "--kubeconfig",
                str(kubeconfig),
                "get",
                "serviceaccount",
                "default",
                "-n",
                "default",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit(
        "up: kube-controller-manager did not create the default ServiceAccount in time"
    )


def down(quiet: bool = False) -> None:
    env_dir = testenv_dir()
    for name in reversed(running_components(env_dir)):
        pid = pid_of(env_dir, name)
        if pid is None:
            continue
        try:
            os.killpg(pid, signal.SIGCONT)  # a paused process cannot die gracefully
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            (env_dir / f"{name}.pid").unlink(missing_ok=True)
            continue
        deadline = time.monotonic() + 15
        while alive(env_dir, name) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(env_dir, name):
            os.killpg(pid, signal.SIGKILL)
        (env_dir / f"{name}.pid").unlink(missing_ok=True)
        if not quiet:
            print(f"down: stopped {name}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down"])
    args = parser.parse_args()
    if args.action == "down":
        down()
        return
    external = os.environ.get("CRONLOCK_TEST_KUBECONFIG")
    if external:
        print(f"export KUBECONFIG={external}")
        return
    exports = up()
    for key, value in exports.items():
        print(f"export {key}={value}")


if __name__ == "__main__":
    main()
