"""Start and stop a real Kubernetes node (kubelet, containerd, runc) for the local control plane.

Standard library only, like controlplane.py. Needs root. The node lives in its own
network namespace, linked to the host by one veth pair and nothing else:

    host netns                                   node netns (no default route)
    127.0.0.1:<api>   kube-apiserver             kubelet, containerd, pods on bridge cn0
    198.51.100.1 cl-host <--- veth ---> cl-node  198.51.100.2
      :6443      node relay -> kube-apiserver    cn0 198.51.100.129/25 (pods .130-.254)
    203.0.113.1  pod relay  -> kube-apiserver    route 203.0.113.0/24 via 198.51.100.1
      :443       (the `kubernetes` Service's ClusterIP; there is no kube-proxy)
    route 198.51.100.128/25 via 198.51.100.2     (logs/exec, the work tracker's clients)

Every address is a documentation range (RFC 5737 TEST-NET-2 and -3), never a private one,
and `up` refuses to start if the host already routes any of them;
nothing in the node's namespace can reach any network beyond this machine, and pods get
no nameserver. The pods' path to the API server is its own relay process, so a test can
cut exactly that path (SIGSTOP the pod relay: connections open and hang) while the
kubelet keeps talking to the API server.

Also started here, on the host's loopback: kube-scheduler. The node-lifecycle
controller runs in the control plane's kube-controller-manager.

    tests/controlplane/node up      # after tests/controlplane/up; prints `export` lines
    tests/controlplane/node down    # stops it and puts the host back as it was

State, logs and pids: `$CRONLOCK_TESTENV_DIR/node/`. Sockets: /run/cronlock-node/.
The host changes the kubelet and containerd make (sysctls, /var/log/containers,
/var/lib/kubelet/device-plugins, /run/containerd, cgroups under /cronlock-node) are
recorded at `up` and undone at `down`.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import controlplane as cp

NETNS = "cronlock-node"
NODE_NAME = "cronlock-node"
HOST_LINK, NODE_LINK = "cl-host", "cl-node"
HOST_LINK_IP, NODE_LINK_IP = cp.NODE_LINK_HOST_IP, "198.51.100.2"
LINK_PREFIX = 30
LINK_NET = "198.51.100.0/30"
BRIDGE = "cn0"
BRIDGE_MAC = "02:00:c6:33:64:81"  # locally administered; c6:33:64:81 = 198.51.100.129
NODE_IP = "198.51.100.129"
POD_SUBNET = "198.51.100.128/25"
POD_RANGE = ("198.51.100.130", "198.51.100.254")
# What the node's network uses; the host must not route any of it already.
RESERVED = ("198.51.100.0/24", cp.SERVICE_CIDR)
NODE_RELAY_PORT = 6443
SERVICE_PORT = 443
RUN_DIR = Path("/run/cronlock-node")
CGROUP_ROOT = "/cronlock-node"
# Hard-coded host paths of the kubelet and containerd's shims.
HOST_PATHS = ("/var/log/containers", "/var/lib/kubelet", "/run/containerd")
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
# Stop order: the kubelet first (so it restarts nothing), containerd after the pods.
PROCESSES = ("kubelet", "containerd", "kube-scheduler", "pod-relay", "node-relay", "registry")
# A real OCI registry (go-containerregistry's `crane registry serve`, built from Go
# modules) on the host's end of the link, where the node's containerd pulls from over
# plain HTTP (certs.d/<registry>/hosts.toml): a release is pushed here and installed the
# way users install it (tests/e2e/test_release.py).
REGISTRY_PORT = 5000
REGISTRY = f"{HOST_LINK_IP}:{REGISTRY_PORT}"
IMAGES = {
    "cronlock": os.environ.get("CRONLOCK_IMAGE", "localhost/cronlock:dev"),
    "cronlock-sidecar": os.environ.get("CRONLOCK_SIDECAR_IMAGE", "localhost/cronlock-sidecar:dev"),
    "pause": os.environ.get("CRONLOCK_PAUSE_IMAGE", "localhost/pause:cronlock"),
    "busybox": os.environ.get("CRONLOCK_BUSYBOX_IMAGE", "localhost/busybox:cronlock"),
}
READY_TIMEOUT = 180.0


def state_dir() -> Path:
    return cp.testenv_dir() / "node"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def in_netns(*argv: str) -> list[str]:
    # nsenter --net, not `ip netns exec`: the latter remounts /sys and hides the cgroup
    # mounts from the kubelet.
    return ["nsenter", f"--net=/run/netns/{NETNS}", "--", *argv]


def stop(name: str, state: Path, grace: float) -> None:
    pid = cp.pid_of(state, name)
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGCONT)  # a paused relay cannot die gracefully
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        (state / f"{name}.pid").unlink(missing_ok=True)
        return
    deadline = time.monotonic() + grace
    while cp.alive(state, name) and time.monotonic() < deadline:
        time.sleep(0.1)
    if cp.alive(state, name):
        os.killpg(pid, signal.SIGKILL)
    (state / f"{name}.pid").unlink(missing_ok=True)
    print(f"node down: stopped {name}", file=sys.stderr)


def sign(pki: Path, out: Path, name: str, subject: str, ext: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cp.openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(out / f"{name}.key"),
        "-out", str(out / f"{name}.csr"), "-subj", subject,
    )  # fmt: skip
    argv = [
        "x509", "-req", "-in", str(out / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
        "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "30",
        "-out", str(out / f"{name}.crt"),
    ]  # fmt: skip
    if ext is not None:
        (out / f"{name}.ext").write_text(ext)
        argv += ["-extfile", str(out / f"{name}.ext")]
    cp.openssl(*argv)


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    env_dir = cp.testenv_dir()
    result = subprocess.run(
        [str(env_dir / "bin" / "kubectl"), "--kubeconfig", str(env_dir / "kubeconfig"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if check and result.returncode != 0:
        raise SystemExit(f"node up: kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def check_addresses_free() -> None:
    """Refuse to shadow any route or address the host already has (its uplink included)."""
    reserved = [ipaddress.ip_network(net) for net in RESERVED]
    routes = json.loads(run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    addresses = json.loads(run("ip", "-j", "-4", "addr").stdout or "[]")
    used = [
        route["dst"] if "/" in route["dst"] else f"{route['dst']}/32"
        for route in routes
        if route.get("dst") not in (None, "default") and route.get("dev") != HOST_LINK
    ]
    used += [
        f"{info['local']}/32"
        for link in addresses
        if link.get("ifname") != HOST_LINK
        for info in link.get("addr_info", [])
    ]
    for net in used:
        try:
            network = ipaddress.ip_network(net, strict=False)
        except ValueError:
            continue
        clash = next((mine for mine in reserved if network.overlaps(mine)), None)
        if clash is not None:
            raise SystemExit(
                f"node up: this host already uses {network}, inside {clash} that the test "
                "node needs; stop whatever uses it (or change RESERVED in node.py)"
            )


def network_up(state: Path) -> None:
    check_addresses_free()
    if not Path(f"/run/netns/{NETNS}").exists():
        run("ip", "netns", "add", NETNS)
    (state / "netns.created").write_text(NETNS)
    if run("ip", "link", "show", HOST_LINK, check=False).returncode != 0:
        run("ip", "link", "add", HOST_LINK, "type", "veth", "peer", "name", NODE_LINK)
        run("ip", "link", "set", NODE_LINK, "netns", NETNS)
    run("ip", "addr", "replace", f"{HOST_LINK_IP}/{LINK_PREFIX}", "dev", HOST_LINK)
    run("ip", "addr", "replace", f"{cp.KUBERNETES_SERVICE_IP}/32", "dev", HOST_LINK)
    run("ip", "link", "set", HOST_LINK, "up")
    run("ip", "route", "replace", POD_SUBNET, "via", NODE_LINK_IP, "dev", HOST_LINK)
    netns = in_netns
    run(*netns("ip", "link", "set", "lo", "up"))
    run(*netns("ip", "addr", "replace", f"{NODE_LINK_IP}/{LINK_PREFIX}", "dev", NODE_LINK))
    run(*netns("ip", "link", "set", NODE_LINK, "up"))
    if run(*netns("ip", "link", "show", BRIDGE), check=False).returncode != 0:
        # A fixed address: a bridge without one takes its lowest port's, which changes as
        # pods come and go, and pods keep the old gateway address in their ARP cache
        # (their packets to the API server, the probes' answers and a dying work's FIN
        # were then lost for seconds).
        run(*netns("ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge"))
    run(*netns("ip", "addr", "replace", f"{NODE_IP}/{POD_SUBNET.split('/')[1]}", "dev", BRIDGE))
    run(*netns("ip", "link", "set", BRIDGE, "up"))
    run(*netns("ip", "route", "replace", cp.SERVICE_CIDR, "via", HOST_LINK_IP, "dev", NODE_LINK))
    # The node's namespace routes between the pods' bridge and the host link only.
    run(*netns("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"))


def save_host_state(state: Path) -> None:
    saved = state / "sysctl.saved"
    if not saved.exists():
        saved.write_text(
            "".join(f"{key}={run('sysctl', '-n', key).stdout.strip()}\n" for key in SYSCTLS)
        )
    created = state / "host-paths.created"
    if not created.exists():
        created.write_text("".join(f"{path}\n" for path in HOST_PATHS if not Path(path).exists()))


def restore_host_state(state: Path) -> None:
    saved = state / "sysctl.saved"
    if saved.exists():
        for line in saved.read_text().splitlines():
            run("sysctl", "-q", "-w", line, check=False)
        saved.unlink()
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(str(state)):
                link.unlink()
    Path("/var/lib/kubelet/device-plugins/kubelet.sock").unlink(missing_ok=True)
    created = state / "host-paths.created"
    if created.exists():
        for path in created.read_text().split():
            remove_empty_dirs(Path(path))
        created.unlink()
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        remove_empty_dirs(hierarchy / CGROUP_ROOT.lstrip("/"))


def remove_empty_dirs(top: Path) -> None:
    if not top.is_dir() or top.is_symlink():
        return
    for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def write_containerd_config(state: Path, bins: Path) -> Path:
    runc = shutil.which("runc") or "/usr/sbin/runc"
    cni_bin = "/usr/lib/cni"
    cni_conf = state / "cni" / "net.d"
    cni_conf.mkdir(parents=True, exist_ok=True)
    (state / "cni" / "ipam").mkdir(parents=True, exist_ok=True)
    (cni_conf / "10-cronlock.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "cronlock-node",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": True,
                        "ipMasq": False,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(state / "cni" / "ipam"),
                            # No default route: pods reach the host's end of the link (the
                            # work tracker, the relays) and the Service range, nothing else.
                            "routes": [
                                {"dst": LINK_NET, "gw": NODE_IP},
                                {"dst": cp.SERVICE_CIDR, "gw": NODE_IP},
                            ],
                            "ranges": [
                                [
                                    {
                                        "subnet": POD_SUBNET,
                                        "rangeStart": POD_RANGE[0],
                                        "rangeEnd": POD_RANGE[1],
                                        "gateway": NODE_IP,
                                    }
                                ]
                            ],
                        },
                    }
                ],
            },
            indent=2,
        )
    )
    config = state / "containerd.toml"
    # root here may lack CAP_SYS_RESOURCE: runc could not lower oom_score_adj to the
    # kubelet's -998 for sandboxes ("can't get final child's PID from pipe: EOF"), so
    # containerd clamps it (restrict_oom_score_adj).
    config.write_text(f"""\
version = 3
root = '{state / "containerd" / "root"}'
state = '{RUN_DIR / "containerd-state"}'
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = '{RUN_DIR / "containerd.sock"}'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '{RUN_DIR / "containerd.sock.ttrpc"}'
  [plugins.'io.containerd.internal.v1.opt']
    path = '{state / "containerd" / "opt"}'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{write_registry_hosts(state)}'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{IMAGES["pause"]}'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = []
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{runc}'
          Root = '{RUN_DIR / "runc"}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{cni_bin}']
      conf_dir = '{cni_conf}'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
""")
    del bins
    return config


def write_registry_hosts(state: Path) -> Path:
    """containerd's hosts directory: the test registry, plain HTTP, and nothing else."""
    hosts = state / "certs.d"
    (hosts / REGISTRY).mkdir(parents=True, exist_ok=True)
    (hosts / REGISTRY / "hosts.toml").write_text(f"""\
server = "http://{REGISTRY}"

[host."http://{REGISTRY}"]
  capabilities = ["pull", "resolve"]
""")
    return hosts


def start_registry(state: Path) -> None:
    crane = subprocess.run(
        [str(cp.HERE / "gotool"), "crane"], check=True, capture_output=True, text=True
    ).stdout.strip()
    storage = state / "registry"
    storage.mkdir(exist_ok=True)
    cp.start(
        "registry",
        [crane, "registry", "serve", "--address", REGISTRY, "--disk", str(storage)],
        state,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            # No proxy: the registry is on this machine's own link.
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(f"http://{REGISTRY}/v2/", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline or not cp.alive(state, "registry"):
            raise SystemExit(f"node up: the registry did not start; see {state / 'logs'}")
        time.sleep(0.2)


def write_kubelet_config(state: Path, pki: Path) -> Path:
    config = state / "kubelet.yaml"
    sock = RUN_DIR / "containerd.sock"
    config.write_text(f"""\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false            # machines here may have cgroup v1 (hybrid)
cgroupDriver: cgroupfs
cgroupRoot: {CGROUP_ROOT}
failSwapOn: false
containerRuntimeEndpoint: unix://{sock}
imageServiceEndpoint: unix://{sock}
podLogsDir: {state / "pod-logs"}
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {pki / "ca.crt"}}}
authorization: {{mode: AlwaysAllow}}   # any client with a certificate of the test CA
resolvConf: ""                 # pods get no nameserver: nothing to resolve, nowhere to go
clusterDomain: cluster.local
# Images cannot be pulled again (there is no registry): never collect them, never
# evict for disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", \
nodefs.inodesFree: "1%"}}
serializeImagePulls: false
volumePluginDir: {state / "kubelet" / "volume-plugins"}
""")
    return config


def import_images(state: Path, bins: Path) -> None:
    prebuilt = os.environ.get("CRONLOCK_IMAGES_DIR")
    if prebuilt:
        images_dir = Path(prebuilt)
    else:  # builds what is missing, from our Dockerfile
        built = subprocess.run(
            [str(cp.HERE / "images")], capture_output=True, text=True, check=False
        )
        if built.returncode != 0:
            raise SystemExit(f"node up: building the images failed:\n{built.stderr[-3000:]}")
        images_dir = Path(built.stdout.strip().splitlines()[-1])
    ctr = in_netns(str(bins / "ctr"), "--address", str(RUN_DIR / "containerd.sock"), "-n", "k8s.io")
    for archive in ("pause", "busybox", "cronlock", "cronlock-sidecar"):
        result = subprocess.run(
            [*ctr, "images", "import", "--local", str(images_dir / f"{archive}.tar")],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise SystemExit(f"node up: importing {archive}.tar failed: {result.stderr.strip()}")
    (state / "images.json").write_text(json.dumps(IMAGES))


def wait_ready(state: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        for name in PROCESSES:
            if not cp.alive(state, name):
                log = state / "logs" / f"{name}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise SystemExit(f"node up: {name} exited; {log}:\n{tail}")
        ready = kubectl(
            "get",
            "node",
            NODE_NAME,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        taints = kubectl("get", "node", NODE_NAME, "-o", "jsonpath={.spec.taints}", check=False)
        if ready == "True" and "not-ready" not in taints:
            return
        time.sleep(0.5)
    raise SystemExit(f"node up: node {NODE_NAME} not Ready after {READY_TIMEOUT:.0f}s")


def up() -> dict[str, str]:
    if os.geteuid() != 0:
        raise SystemExit("node up: needs root (network namespaces, mounts, cgroups)")
    env_dir = cp.testenv_dir()
    kubeconfig = env_dir / "kubeconfig"
    if not kubeconfig.exists() or not cp.alive(env_dir, "kube-apiserver"):
        raise SystemExit("node up: start the control plane first (tests/controlplane/up)")
    state = state_dir()
    exports = {
        "CRONLOCK_NODE_DIR": str(state),
        "CRONLOCK_NODE_NAME": NODE_NAME,
        "CRONLOCK_REGISTRY": REGISTRY,
    }
    if all(cp.alive(state, name) for name in PROCESSES):
        return exports
    if (state / "kubelet.argv").exists() and all(
        cp.alive(state, name) for name in PROCESSES if name != "kubelet"
    ):
        # Only the kubelet is gone (a test stopped it: node loss): start it again on the
        # same containerd, whose containers kept running, as a restarted kubelet would.
        cp.start("kubelet", json.loads((state / "kubelet.argv").read_text()), state)
        wait_ready(state)
        return exports
    owner = RUN_DIR / "owner"
    if owner.exists() and owner.read_text() != str(state):
        other = Path(owner.read_text())
        if any(cp.alive(other, name) for name in PROCESSES):
            raise SystemExit(f"node up: another test node is running ({other}); stop it first")
    down(quiet=True)
    subprocess.run([str(cp.HERE / "host-packages")], check=True)
    bins = cp.build_bin_dir()
    state.mkdir(parents=True, exist_ok=True)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    owner.write_text(str(state))
    pki = env_dir / "pki"
    api = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    api_port = api.rsplit(":", 1)[1]

    save_host_state(state)
    network_up(state)
    relay = [sys.executable, str(cp.HERE / "relay.py")]
    cp.start(
        "node-relay", [*relay, HOST_LINK_IP, str(NODE_RELAY_PORT), "127.0.0.1", api_port], state
    )
    cp.start(
        "pod-relay",
        [*relay, cp.KUBERNETES_SERVICE_IP, str(SERVICE_PORT), "127.0.0.1", api_port],
        state,
    )
    start_registry(state)

    certs = state / "pki"
    sign(pki, certs, "kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}")
    sign(pki, certs, "kube-scheduler", "/CN=system:kube-scheduler")
    # The kubelet's serving certificate, for the API server's logs/exec calls.
    sign(pki, certs, "kubelet-serving", f"/CN={NODE_NAME}", f"subjectAltName=IP:{NODE_IP}\n")
    cp.write_kubeconfig(
        state / "kubelet.kubeconfig",
        f"https://{HOST_LINK_IP}:{NODE_RELAY_PORT}",
        pki,
        "kubelet",
        cert_dir=certs,
    )
    cp.write_kubeconfig(
        state / "kube-scheduler.kubeconfig", api, pki, "kube-scheduler", cert_dir=certs
    )
    # RBAC is the API server's only authorizer: grant the node group the built-in role
    # the Node authorizer would otherwise stand for.
    kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "cronlock-test-system-nodes"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:node",
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Group",
                        "name": "system:nodes",
                    }
                ],
            }
        ),
    )
    scheduler_kubeconfig = str(state / "kube-scheduler.kubeconfig")
    cp.start(
        "kube-scheduler",
        [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={scheduler_kubeconfig}",
            f"--authentication-kubeconfig={scheduler_kubeconfig}",
            f"--authorization-kubeconfig={scheduler_kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={cp.free_port()}",
            "--v=1",
        ],
        state,
    )

    containerd_config = write_containerd_config(state, bins)
    env = {**os.environ, "PATH": f"{bins}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    cp.start(
        "containerd",
        in_netns(str(bins / "containerd"), "--config", str(containerd_config)),
        state,
        env,
    )
    sock = RUN_DIR / "containerd.sock"
    deadline = time.monotonic() + 30
    while not sock.exists():
        if time.monotonic() > deadline or not cp.alive(state, "containerd"):
            raise SystemExit(f"node up: containerd did not start; see {state / 'logs'}")
        time.sleep(0.2)
    import_images(state, bins)

    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if hierarchy.is_dir():
            (hierarchy / CGROUP_ROOT.lstrip("/")).mkdir(exist_ok=True)
    (state / "pod-logs").mkdir(exist_ok=True)
    (state / "kubelet").mkdir(exist_ok=True)
    kubelet_argv = in_netns(
        str(bins / "kubelet"),
        f"--config={write_kubelet_config(state, pki)}",
        f"--kubeconfig={state / 'kubelet.kubeconfig'}",
        f"--root-dir={state / 'kubelet'}",
        f"--cert-dir={state / 'kubelet' / 'pki'}",
        f"--tls-cert-file={certs / 'kubelet-serving.crt'}",
        f"--tls-private-key-file={certs / 'kubelet-serving.key'}",
        f"--node-ip={NODE_IP}",
        f"--hostname-override={NODE_NAME}",
        "--v=2",
    )
    (state / "kubelet.argv").write_text(json.dumps(kubelet_argv))
    cp.start("kubelet", kubelet_argv, state)
    wait_ready(state)
    return exports


def down(quiet: bool = False) -> None:
    state = state_dir()
    for name in PROCESSES:
        if name == "containerd" and cp.alive(state, name):
            remove_pods(state)
        stop(name, state, grace=20 if name in ("kubelet", "containerd") else 5)
    if not state.exists():
        return
    # Mounts the kubelet and containerd left (volumes, rootfs, netns files), deepest first.
    prefixes = (f"{state}/", f"{RUN_DIR}/")
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefixes)
    ]
    for mount in sorted(mounts, key=len, reverse=True):
        run("umount", "-l", mount, check=False)
    if (state / "netns.created").exists():
        run("ip", "link", "del", HOST_LINK, check=False)
        run("ip", "netns", "del", NETNS, check=False)
        (state / "netns.created").unlink()
    restore_host_state(state)
    owner = RUN_DIR / "owner"
    if owner.exists() and owner.read_text() == str(state):
        shutil.rmtree(RUN_DIR, ignore_errors=True)
    if not quiet:
        print("node down: host restored", file=sys.stderr)


def remove_pods(state: Path) -> None:
    bins = cp.build_bin_dir()
    crictl = in_netns(
        str(bins / "crictl"),
        "--runtime-endpoint",
        f"unix://{RUN_DIR / 'containerd.sock'}",
        "--image-endpoint",
        f"unix://{RUN_DIR / 'containerd.sock'}",
        "--timeout",
        "10s",
    )
    pods = run(*crictl, "pods", "-q", check=False).stdout.split()
    for pod in pods:
        run(*crictl, "stopp", pod, check=False)
        run(*crictl, "rmp", "-f", pod, check=False)
    del state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down"])
    args = parser.parse_args()
    if args.action == "down":
        down()
        return
    for key, value in up().items():
        print(f"export {key}={value}")


if __name__ == "__main__":
    main()
