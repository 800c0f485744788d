"""Start and stop a real Kubernetes node (kubelet, containerd, runc) for the local control plane.

Standard library only, like controlplane.py. Needs root. The node lives in its own
network namespace, linked to the host by one veth pair and nothing else:

    host netns                                   node netns (no default route)
    127.0.0.1:<api>   kube-apiserver             kubelet, containerd, pods on bridge cn0
    198.51.100.1 cl-host <--- veth ---> cl-node  198.51.100.2
      :6443      node relay -> kube-apiserver    cn0 198.51.100.129/25 (pods .130-.254)
    203.0.113.1  pod relay  -> kube-apiserver    route 203.0.113.0/25 via 198.51.100.1
      :443       (the `kubernetes` Service's ClusterIP; there is no kube-proxy)
    route 198.51.100.128/25 via 198.51.100.2     (logs/exec, the work tracker's clients)

Every address is a documentation range (RFC 5737 TEST-NET-2 and -3), never a private one,
and `up` refuses to start if the host already routes any of them;
nothing in the node's namespace can reach any network beyond this machine, and pods get
no nameserver. The pods' path to the API server is its own relay process, so a test can
cut exactly that path (SIGSTOP the pod relay: connections open and hang) while the
kubelet keeps talking to the API server.

More nodes make a fleet (`node up --index 2`): each one its own network namespace, veth
pair, node relay, containerd, kubelet, cgroup root and /run directory; its link in the
part of TEST-NET-2 node 1 leaves free, its pods in TEST-NET-3's top half (the Service
range is the bottom half; TEST-NET-1 is this sandbox's uplink). 125 pods on each node:

    198.51.100.5 cl-host2 <--- veth ---> cl-node2 198.51.100.6   cn0 203.0.113.129/25
      :6443 node 2's relay -> kube-apiserver      (pods .130-.254); routes 203.0.113.0/25
    route 203.0.113.128/25 via 198.51.100.6       and 198.51.100.0/30 via 198.51.100.5

Node 2's pods reach the pod relay (the Service IP) and the host's end of node 1's link
(the work tracker, the registry) through the host. A test partitions node 2 from the API
server (tests/support/node.py) by pausing its relay and blackholing the Service range in
its namespace; the path to the tracker stays, so the test still sees when work stops.

Nodes 3 and 4 are each a cluster of their own (`node up --index 3 --cluster DIR`, DIR a
control plane's test environment): the only node of that control plane, with its own
kube-scheduler, and its pods' `kubernetes` Service address on lo in its namespace, where
its own pod relay forwards it through its link to that control plane alone (node 1's
holds the address on the host, for another control plane). Nothing is routed through
the host but its link: its pods reach the host's end of it, and no other node's.

    198.51.100.9  cl-host3 <--- veth ---> cl-node3 198.51.100.10  cn0 198.51.100.65/27
      :6443 node 3's relay -> DIR's api     (pods .66-.94); 203.0.113.1/32 on lo: its pod
    route 198.51.100.64/27 via .10          relay -> 198.51.100.9:6443
    198.51.100.13 cl-host4 ... cl-node4 .14  cn0 198.51.100.97/27 (pods .98-.126)
    198.51.100.17 cl-host5 ... cl-node5 .18  cn0 198.51.100.33/27 (pods .34-.62)

Node 5 is the same, for the second e2e ring (tests/rings.py "e2e-b", CRONLOCK_E2E_NODE=5).

`--pod-start-delay S` makes every pod of a node start S seconds late (a CNI plugin
chained after the bridge waits on each ADD).

Also started here, on the host's loopback: kube-scheduler. The node-lifecycle
controller runs in the control plane's kube-controller-manager.

    tests/controlplane/node up      # after tests/controlplane/up; prints `export` lines
    tests/controlplane/node up --index 2    # a second node (node 1 first)
    tests/controlplane/node down [--index 2]  # stops it and puts the host back as it was
    tests/controlplane/node up --index 3 --cluster DIR [--pod-start-delay 15]

State, logs and pids: `$CRONLOCK_TESTENV_DIR/node/`. Sockets: /run/cronlock-node/.
The host changes the kubelet and containerd make (sysctls, /var/log/containers,
/var/lib/kubelet/device-plugins, /run/containerd, cgroups under /cronlock-node) are
recorded at `up` and undone at `down`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import controlplane as cp

LINK_PREFIX = 30
BRIDGE = "cn0"
NODE_RELAY_PORT = 6443
SERVICE_PORT = 443


@dataclass(frozen=True)
class Node:
    """One node's names and addresses. Node 1 owns TEST-NET-2's top half (its pods) and
    first link; node 2 the link after it and TEST-NET-3's top half (its pods)."""

    index: int
    name: str
    host_link: str
    node_link: str
    host_link_ip: str
    node_link_ip: str
    link_net: str
    node_ip: str  # the bridge's address: the pods' gateway
    pod_subnet: str
    pod_range: tuple[str, str]
    bridge_mac: str  # locally administered, fixed (see network_up)
    reserved: tuple[str, ...]  # what its network uses; the host must not route it already
    # `node up --cluster DIR`: the only node of the control plane in DIR, which runs that
    # cluster's kube-scheduler and its pods' relay itself (`leads`), apart from node 1's.
    own_cluster: bool = False
    # `node up --pod-start-delay S`: its network plugin takes S seconds more to set up each
    # pod (a chained CNI plugin that waits), so every pod there starts that much later.
    pod_start_delay: float = 0.0

    @property
    def netns(self) -> str:
        return self.name

    @property
    def run_dir(self) -> Path:
        return Path(f"/run/{self.name}")

    @property
    def cgroup_root(self) -> str:
        return f"/{self.name}"

    @property
    def first(self) -> bool:
        """Node 1 also runs what the fleet shares: scheduler, pod relay, registry."""
        return self.index == 1

    @property
    def leads(self) -> bool:
        """Whether it runs its control plane's scheduler and pod relay: node 1, or a node
        of a cluster of its own."""
        return self.first or self.own_cluster

    @property
    def processes(self) -> tuple[str, ...]:
        # Stop order: the kubelet first (so it restarts nothing), containerd after the pods.
        if self.first:
            return PROCESSES
        if self.own_cluster:
            return ("kubelet", "containerd", "kube-scheduler", "pod-relay", "node-relay")
        return ("kubelet", "containerd", "node-relay")


NODES = {
    1: Node(
        1, "cronlock-node", "cl-host", "cl-node", cp.NODE_LINK_HOST_IP, "198.51.100.2",
        "198.51.100.0/30", "198.51.100.129", "198.51.100.128/25",
        ("198.51.100.130", "198.51.100.254"), "02:00:c6:33:64:81",
        ("198.51.100.0/30", "198.51.100.128/25", cp.SERVICE_CIDR),
    ),
    2: Node(
        2, "cronlock-node-2", "cl-host2", "cl-node2", cp.NODE2_LINK_HOST_IP, "198.51.100.6",
        "198.51.100.4/30", "203.0.113.129", "203.0.113.128/25",
        ("203.0.113.130", "203.0.113.254"), "02:00:c6:33:64:41",
        ("198.51.100.4/30", "203.0.113.128/25"),
    ),
    # Nodes 3 and 4 (meant for clusters of their own, `--cluster`): the next links, and
    # TEST-NET-2's free middle for their pods (29 each).
    3: Node(
        3, "cronlock-node-3", "cl-host3", "cl-node3", cp.NODE3_LINK_HOST_IP, "198.51.100.10",
        "198.51.100.8/30", "198.51.100.65", "198.51.100.64/27",
        ("198.51.100.66", "198.51.100.94"), "02:00:c6:33:64:03",
        ("198.51.100.8/30", "198.51.100.64/27"),
    ),
    4: Node(
        4, "cronlock-node-4", "cl-host4", "cl-node4", cp.NODE4_LINK_HOST_IP, "198.51.100.14",
        "198.51.100.12/30", "198.51.100.97", "198.51.100.96/27",
        ("198.51.100.98", "198.51.100.126"), "02:00:c6:33:64:04",
        ("198.51.100.12/30", "198.51.100.96/27"),
    ),
    # Node 5 (the second e2e ring's cluster of its own, tests/rings.py): the link after
    # node 4's, and the rest of TEST-NET-2's free middle for its pods (29).
    5: Node(
        5, "cronlock-node-5", "cl-host5", "cl-node5", cp.NODE5_LINK_HOST_IP, "198.51.100.18",
        "198.51.100.16/30", "198.51.100.33", "198.51.100.32/27",
        ("198.51.100.34", "198.51.100.62"), "02:00:c6:33:64:05",
        ("198.51.100.16/30", "198.51.100.32/27"),
    ),
}  # fmt: skip
FIRST = NODES[1]
# Kept for the single-node callers.
NETNS, NODE_NAME = FIRST.netns, FIRST.name
HOST_LINK_IP = FIRST.host_link_ip
RUN_DIR = FIRST.run_dir
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
# Node 1's, in stop order: the kubelet first (so it restarts nothing), containerd after
# the pods.
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


def state_dir(node: Node = FIRST) -> Path:
    return cp.testenv_dir() / ("node" if node.first else f"node-{node.index}")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def in_netns(*argv: str, node: Node = FIRST) -> list[str]:
    # nsenter --net, not `ip netns exec`: the latter remounts /sys and hides the cgroup
    # mounts from the kubelet.
    return ["nsenter", f"--net=/run/netns/{node.netns}", "--", *argv]


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


def check_addresses_free(node: Node) -> None:
    """Refuse to shadow any route or address the host already has (its uplink included)."""
    reserved = [ipaddress.ip_network(net) for net in node.reserved]
    ours = {n.host_link for n in NODES.values()}
    routes = json.loads(run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    addresses = json.loads(run("ip", "-j", "-4", "addr").stdout or "[]")
    used = [
        route["dst"] if "/" in route["dst"] else f"{route['dst']}/32"
        for route in routes
        if route.get("dst") not in (None, "default") and route.get("dev") not in ours
    ]
    used += [
        f"{info['local']}/32"
        for link in addresses
        if link.get("ifname") not in ours
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
                "node needs; stop whatever uses it (or change NODES in node.py)"
            )


def network_up(state: Path, node: Node) -> None:
    check_addresses_free(node)
    if not Path(f"/run/netns/{node.netns}").exists():
        run("ip", "netns", "add", node.netns)
    (state / "netns.created").write_text(node.netns)
    if run("ip", "link", "show", node.host_link, check=False).returncode != 0:
        run("ip", "link", "add", node.host_link, "type", "veth", "peer", "name", node.node_link)
        run("ip", "link", "set", node.node_link, "netns", node.netns)
    run("ip", "addr", "replace", f"{node.host_link_ip}/{LINK_PREFIX}", "dev", node.host_link)
    if node.first:
        run("ip", "addr", "replace", f"{cp.KUBERNETES_SERVICE_IP}/32", "dev", node.host_link)
    run("ip", "link", "set", node.host_link, "up")
    run("ip", "route", "replace", node.pod_subnet, "via", node.node_link_ip, "dev", node.host_link)

    def netns(*argv: str) -> list[str]:
        return in_netns(*argv, node=node)

    run(*netns("ip", "link", "set", "lo", "up"))
    address = f"{node.node_link_ip}/{LINK_PREFIX}"
    run(*netns("ip", "addr", "replace", address, "dev", node.node_link))
    run(*netns("ip", "link", "set", node.node_link, "up"))
    if run(*netns("ip", "link", "show", BRIDGE), check=False).returncode != 0:
        # A fixed address: a bridge without one takes its lowest port's, which changes as
        # pods come and go, and pods keep the old gateway address in their ARP cache
        # (their packets to the API server, the probes' answers and a dying work's FIN
        # were then lost for seconds).
        run(*netns("ip", "link", "add", BRIDGE, "address", node.bridge_mac, "type", "bridge"))
    prefix = node.pod_subnet.split("/")[1]
    run(*netns("ip", "addr", "replace", f"{node.node_ip}/{prefix}", "dev", BRIDGE))
    run(*netns("ip", "link", "set", BRIDGE, "up"))
    for destination in upstream(node):
        run(*netns("ip", "route", "replace", destination, "via", node.host_link_ip))
    if node.own_cluster:
        # Its pods' `kubernetes` Service address is its own pod relay's, in this
        # namespace: not node 1's on the host, which is another control plane's.
        address = f"{cp.KUBERNETES_SERVICE_IP}/32"
        run(*netns("ip", "addr", "replace", address, "dev", "lo"))
    # The node's namespace routes between the pods' bridge and the host link only.
    run(*netns("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"))


def upstream(node: Node) -> tuple[str, ...]:
    """What the node's namespace and pods reach through the host: the Service range (the
    pod relay) and, from another node, node 1's link (the work tracker, the registry).
    A node of a cluster of its own reaches nothing there but its own link's host end."""
    if node.own_cluster:
        return ()
    return (cp.SERVICE_CIDR,) if node.first else (cp.SERVICE_CIDR, FIRST.link_net)


def pod_routes(node: Node) -> tuple[str, ...]:
    """The pods' routes (all via the bridge): their host's end of the link, what the
    namespace reaches upstream, and a cluster of its own's Service range (its relay)."""
    own = (cp.SERVICE_CIDR,) if node.own_cluster else ()
    return (node.link_net, *upstream(node), *own)


def other_leaders(state: Path) -> list[Path]:
    """The state directories of the other nodes that lead a cluster and whose kubelet
    runs (node 1, or a node of another control plane): they saved the host as it was."""
    found = []
    for owner in sorted(Path("/run").glob("cronlock-node*/owner")):
        with contextlib.suppress(OSError):
            other = Path(owner.read_text())
            if other != state and (other / "sysctl.saved").exists() and cp.alive(other, "kubelet"):
                found.append(other)
    return found


def save_host_state(state: Path) -> None:
    """What the kubelet changes on the host, as it was before any of ours ran: a leader
    started while another runs takes that one's record (the host has its kubelet's values
    now), so whichever stops last puts the host back as it was."""
    before = other_leaders(state)
    saved = state / "sysctl.saved"
    if not saved.exists():
        saved.write_text(
            (before[0] / "sysctl.saved").read_text()
            if before
            else "".join(f"{key}={run('sysctl', '-n', key).stdout.strip()}\n" for key in SYSCTLS)
        )
    created = state / "host-paths.created"
    if not created.exists():
        earlier = before[0] / "host-paths.created" if before else None
        created.write_text(
            earlier.read_text()
            if earlier is not None and earlier.exists()
            else "".join(f"{path}\n" for path in HOST_PATHS if not Path(path).exists())
        )


def restore_host_state(state: Path, node: Node) -> None:
    """A leading node (node 1, a cluster's own) saved the sysctls and host paths, and puts
    them back (the host paths once no other leader runs); every node its own log links and
    cgroups."""
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
    alone = not other_leaders(state)
    if node.leads and alone:  # every kubelet's (a shared path); the last one takes it away
        Path("/var/lib/kubelet/device-plugins/kubelet.sock").unlink(missing_ok=True)
    created = state / "host-paths.created"
    if created.exists():
        if alone:
            for path in created.read_text().split():
                remove_empty_dirs(Path(path))
        created.unlink()
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        remove_empty_dirs(hierarchy / node.cgroup_root.lstrip("/"))


def remove_empty_dirs(top: Path) -> None:
    if not top.is_dir() or top.is_symlink():
        return
    for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def write_containerd_config(state: Path, bins: Path, node: Node) -> Path:
    runc = shutil.which("runc") or "/usr/sbin/runc"
    cni_bin = "/usr/lib/cni"
    cni_conf = state / "cni" / "net.d"
    cni_conf.mkdir(parents=True, exist_ok=True)
    (state / "cni" / "ipam").mkdir(parents=True, exist_ok=True)
    (cni_conf / "10-cronlock.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": node.name,
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
                                {"dst": destination, "gw": node.node_ip}
                                for destination in pod_routes(node)
                            ],
                            "ranges": [
                                [
                                    {
                                        "subnet": node.pod_subnet,
                                        "rangeStart": node.pod_range[0],
                                        "rangeEnd": node.pod_range[1],
                                        "gateway": node.node_ip,
                                    }
                                ]
                            ],
                        },
                    },
                    *slow_start(state, node),
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
state = '{node.run_dir / "containerd-state"}'
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = '{node.run_dir / "containerd.sock"}'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '{node.run_dir / "containerd.sock.ttrpc"}'
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
          Root = '{node.run_dir / "runc"}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{cni_bin}', '{state / "cni" / "bin"}']
      conf_dir = '{cni_conf}'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
""")
    del bins
    return config


SLOW_START_PLUGIN = "cronlock-slow-start"


def slow_start(state: Path, node: Node) -> list[dict[str, object]]:
    """The CNI plugin chained after the bridge that makes every pod start late
    (`--pod-start-delay`), as a slow network plugin would: on ADD it waits, then passes
    the bridge's result on; nothing else. Empty (no plugin) without a delay."""
    plugins = state / "cni" / "bin"
    plugins.mkdir(parents=True, exist_ok=True)
    if not node.pod_start_delay:
        return []
    plugin = plugins / SLOW_START_PLUGIN
    plugin.write_text(f"""#!{sys.executable}
import json, os, sys, time
config = json.load(sys.stdin)
command = os.environ.get("CNI_COMMAND")
if command == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}}))
elif command == "ADD":
    time.sleep(float(config["seconds"]))
    print(json.dumps(config["prevResult"]))
""")
    plugin.chmod(0o755)
    return [{"type": SLOW_START_PLUGIN, "seconds": node.pod_start_delay}]


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


def write_kubelet_config(state: Path, pki: Path, node: Node) -> Path:
    config = state / "kubelet.yaml"
    sock = node.run_dir / "containerd.sock"
    config.write_text(
        f"""\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false            # machines here may have cgroup v1 (hybrid)
cgroupDriver: cgroupfs
cgroupRoot: {node.cgroup_root}
failSwapOn: false
containerRuntimeEndpoint: unix://{sock}
imageServiceEndpoint: unix://{sock}
podLogsDir: {state / "pod-logs"}
address: {node.node_ip}
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
"""
        + feature_gates(os.environ.get("CRONLOCK_KUBELET_FEATURE_GATES", ""))
    )
    return config


def feature_gates(text: str) -> str:
    """`featureGates:` of the kubelet's config from `A=true,B=false` (a benchmark's choice,
    e.g. EventedPLEG; empty: the kubelet's defaults)."""
    gates = [item.strip().split("=", 1) for item in text.split(",") if item.strip()]
    if not gates:
        return ""
    for gate in gates:
        if len(gate) != 2 or gate[1] not in ("true", "false") or not gate[0].isalnum():
            raise SystemExit(f"CRONLOCK_KUBELET_FEATURE_GATES: {text!r} is not NAME=true|false,...")
    return "featureGates:\n" + "".join(f"  {name}: {value}\n" for name, value in gates)


def import_images(state: Path, bins: Path, node: Node) -> None:
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
    sock = str(node.run_dir / "containerd.sock")
    ctr = in_netns(str(bins / "ctr"), "--address", sock, "-n", "k8s.io", node=node)
    for archive in ("pause", "busybox", "cronlock", "cronlock-sidecar", "cronlock-sidecar-stores"):
        result = subprocess.run(
            [*ctr, "images", "import", "--local", str(images_dir / f"{archive}.tar")],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise SystemExit(f"node up: importing {archive}.tar failed: {result.stderr.strip()}")
    (state / "images.json").write_text(json.dumps(IMAGES))


def wait_ready(state: Path, node: Node) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        for name in node.processes:
            if not cp.alive(state, name):
                log = state / "logs" / f"{name}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise SystemExit(f"node up: {name} exited; {log}:\n{tail}")
        ready = kubectl(
            "get",
            "node",
            node.name,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        taints = kubectl("get", "node", node.name, "-o", "jsonpath={.spec.taints}", check=False)
        if ready == "True" and "not-ready" not in taints:
            return
        time.sleep(0.5)
    raise SystemExit(f"node up: node {node.name} not Ready after {READY_TIMEOUT:.0f}s")


def up(node: Node = FIRST) -> dict[str, str]:
    if os.geteuid() != 0:
        raise SystemExit("node up: needs root (network namespaces, mounts, cgroups)")
    env_dir = cp.testenv_dir()
    kubeconfig = env_dir / "kubeconfig"
    apiservers = [name for name in cp.running_components(env_dir) if "apiserver" in name]
    if not kubeconfig.exists() or not any(cp.alive(env_dir, name) for name in apiservers):
        raise SystemExit("node up: start the control plane first (tests/controlplane/up)")
    if not node.leads and not all(cp.alive(state_dir(), name) for name in PROCESSES):
        raise SystemExit(f"node up: node {node.index} joins node 1's fleet; start node 1 first")
    state = state_dir(node)
    exports = {
        "CRONLOCK_NODE_DIR": str(state),
        "CRONLOCK_NODE_NAME": node.name,
        "CRONLOCK_REGISTRY": REGISTRY,
    }
    if all(cp.alive(state, name) for name in node.processes):
        return exports
    restartable = ("kubelet", "containerd")
    if all((state / f"{name}.argv").exists() for name in restartable) and all(
        cp.alive(state, name) for name in node.processes if name not in restartable
    ):
        # Only the kubelet or containerd is gone (a test stopped it: node loss, a runtime
        # crash): start it again as systemd would; the containers kept running under their
        # shims, and the restarted kubelet and containerd find them.
        if not cp.alive(state, "containerd"):
            (node.run_dir / "containerd.sock").unlink(missing_ok=True)  # the dead one's
            cp.start("containerd", *restart_args(state, "containerd"))
            wait_socket(state, node)
        if not cp.alive(state, "kubelet"):
            cp.start("kubelet", *restart_args(state, "kubelet"))
        wait_ready(state, node)
        return exports
    owner = node.run_dir / "owner"
    if owner.exists() and owner.read_text() != str(state):
        other = Path(owner.read_text())
        if any(cp.alive(other, name) for name in node.processes):
            raise SystemExit(f"node up: another test node is running ({other}); stop it first")
    down(node, quiet=True)
    clear_dead_run_dir(node)
    if node.leads:
        subprocess.run([str(cp.HERE / "host-packages")], check=True)
    bins = cp.build_bin_dir()
    state.mkdir(parents=True, exist_ok=True)
    node.run_dir.mkdir(parents=True, exist_ok=True)
    owner.write_text(str(state))
    pki = env_dir / "pki"
    api = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    api_port = api.rsplit(":", 1)[1]

    if node.leads:
        save_host_state(state)
    network_up(state, node)
    relay = [sys.executable, str(cp.HERE / "relay.py")]
    cp.start(
        "node-relay",
        [*relay, node.host_link_ip, str(NODE_RELAY_PORT), "127.0.0.1", api_port],
        state,
    )
    certs = state / "pki"
    sign(pki, certs, "kubelet", f"/O=system:nodes/CN=system:node:{node.name}")
    # The kubelet's serving certificate, for the API server's logs/exec calls.
    sign(pki, certs, "kubelet-serving", f"/CN={node.name}", f"subjectAltName=IP:{node.node_ip}\n")
    cp.write_kubeconfig(
        state / "kubelet.kubeconfig",
        f"https://{node.host_link_ip}:{NODE_RELAY_PORT}",
        pki,
        "kubelet",
        cert_dir=certs,
    )
    if node.leads:
        start_shared(state, bins, pki, api, api_port, certs, node)

    containerd_config = write_containerd_config(state, bins, node)
    env = {**os.environ, "PATH": f"{bins}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    containerd_argv = in_netns(
        str(bins / "containerd"), "--config", str(containerd_config), node=node
    )
    (state / "containerd.argv").write_text(json.dumps({"argv": containerd_argv, "env": env}))
    cp.start("containerd", containerd_argv, state, env)
    wait_socket(state, node)
    import_images(state, bins, node)

    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if hierarchy.is_dir():
            (hierarchy / node.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
    (state / "pod-logs").mkdir(exist_ok=True)
    (state / "kubelet").mkdir(exist_ok=True)
    kubelet_argv = in_netns(
        str(bins / "kubelet"),
        f"--config={write_kubelet_config(state, pki, node)}",
        f"--kubeconfig={state / 'kubelet.kubeconfig'}",
        f"--root-dir={state / 'kubelet'}",
        f"--cert-dir={state / 'kubelet' / 'pki'}",
        f"--tls-cert-file={certs / 'kubelet-serving.crt'}",
        f"--tls-private-key-file={certs / 'kubelet-serving.key'}",
        f"--node-ip={node.node_ip}",
        f"--hostname-override={node.name}",
        "--v=2",
        node=node,
    )
    (state / "kubelet.argv").write_text(json.dumps({"argv": kubelet_argv}))
    cp.start("kubelet", kubelet_argv, state)
    wait_ready(state, node)
    return exports


def restart_args(state: Path, name: str) -> tuple[list[str], Path, dict[str, str] | None]:
    """What `up` started `name` with (its argv and environment), to start it again."""
    saved = json.loads((state / f"{name}.argv").read_text())
    return saved["argv"], state, saved.get("env")


def clear_dead_run_dir(node: Node) -> None:
    """Remove what a node whose processes are all gone left in its /run directory (a run
    killed before `down`): its stale containerd.sock would answer "connection refused"
    to the new containerd's first client."""
    if not node.run_dir.exists():
        return
    unmount_below(node.run_dir)
    shutil.rmtree(node.run_dir, ignore_errors=True)


def unmount_below(*directories: Path) -> None:
    """Unmount (lazily) every mount under these directories, deepest first."""
    prefixes = tuple(f"{directory}/" for directory in directories)
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefixes)
    ]
    for mount in sorted(mounts, key=len, reverse=True):
        run("umount", "-l", mount, check=False)


def wait_socket(state: Path, node: Node) -> None:
    """Until containerd accepts a connection on its socket: the file alone may be a dead
    one's, or be there a moment before containerd serves it."""
    sock = node.run_dir / "containerd.sock"
    deadline = time.monotonic() + 30
    while True:
        if not cp.alive(state, "containerd"):
            raise SystemExit(f"node up: containerd exited; see {state / 'logs'}")
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sock))
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"node up: containerd did not serve {sock}; see {state / 'logs'}")
        time.sleep(0.2)


def start_shared(
    state: Path, bins: Path, pki: Path, api: str, api_port: str, certs: Path, node: Node
) -> None:
    """What node 1 runs for the whole fleet: the pod relay (the `kubernetes` Service's
    ClusterIP), the registry, kube-scheduler, and the node group's RBAC. A node of a
    cluster of its own runs the same but the registry, its pod relay in its namespace
    (to its control plane through its node relay), since node 1's owns the address on
    the host."""
    relay = [sys.executable, str(cp.HERE / "relay.py")]
    if node.own_cluster:
        cp.start(
            "pod-relay",
            in_netns(
                *relay,
                *(cp.KUBERNETES_SERVICE_IP, str(SERVICE_PORT)),
                *(node.host_link_ip, str(NODE_RELAY_PORT)),
                node=node,
            ),
            state,
        )
    else:
        cp.start(
            "pod-relay",
            [*relay, cp.KUBERNETES_SERVICE_IP, str(SERVICE_PORT), "127.0.0.1", api_port],
            state,
        )
        start_registry(state)
    sign(pki, certs, "kube-scheduler", "/CN=system:kube-scheduler")
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


def down(node: Node = FIRST, quiet: bool = False) -> None:
    if node.first:  # the fleet's other nodes go first: they run on node 1's relay
        for other in NODES.values():
            if not other.first and state_dir(other).exists():
                down(other, quiet=True)
    state = state_dir(node)
    # Every process a node may run, whatever this one was started as (all in stop order).
    for name in PROCESSES:
        if name == "containerd" and cp.alive(state, name):
            remove_pods(node)
        stop(name, state, grace=20 if name in ("kubelet", "containerd") else 5)
    if not state.exists():
        return
    # Mounts the kubelet and containerd left (volumes, rootfs, netns files), deepest first.
    unmount_below(state, node.run_dir)
    if (state / "netns.created").exists():
        run("ip", "link", "del", node.host_link, check=False)
        run("ip", "netns", "del", node.netns, check=False)
        (state / "netns.created").unlink()
    restore_host_state(state, node)
    if not node.first:  # the control plane forgets it, as a deleted cloud node goes
        kubectl(
            *("delete", "node", node.name, "--ignore-not-found", "--wait=false"),
            "--request-timeout=10s",  # its control plane may be gone (a cluster of its own)
            check=False,
        )
    owner = node.run_dir / "owner"
    if owner.exists() and owner.read_text() == str(state):
        shutil.rmtree(node.run_dir, ignore_errors=True)
    if not quiet:
        print(f"node down: {node.name} stopped, host restored", file=sys.stderr)


def remove_pods(node: Node) -> None:
    bins = cp.build_bin_dir()
    sock = f"unix://{node.run_dir / 'containerd.sock'}"
    crictl = in_netns(
        str(bins / "crictl"),
        *("--runtime-endpoint", sock, "--image-endpoint", sock, "--timeout", "10s"),
        node=node,
    )
    pods = run(*crictl, "pods", "-q", check=False).stdout.split()
    for pod in pods:
        run(*crictl, "stopp", pod, check=False)
        run(*crictl, "rmp", "-f", pod, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument(
        "--index",
        type=int,
        choices=sorted(NODES),
        default=1,
        help="which node (default 1; without --cluster, another joins node 1's fleet and "
        "needs node 1 up)",
    )
    parser.add_argument(
        "--cluster",
        type=Path,
        metavar="DIR",
        help="join the control plane whose test environment is DIR (tests/controlplane/up "
        "with CRONLOCK_TESTENV_DIR=DIR) as its only node, with a kube-scheduler and pod relay "
        "of its own (not node 1's); --index 2 or more",
    )
    parser.add_argument(
        "--pod-start-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with up: set up each pod's network SECONDS late (every pod starts that late)",
    )
    args = parser.parse_args()
    node = NODES[args.index]
    if args.cluster is not None:
        if node.first:
            raise SystemExit("node: --cluster needs --index 2 or more (node 1 is the default's)")
        if not (args.cluster / "kubeconfig").exists():
            raise SystemExit(
                f"node: {args.cluster} holds no control plane; start one there first "
                f"(CRONLOCK_TESTENV_DIR={args.cluster} tests/controlplane/up)"
            )
        os.environ["CRONLOCK_TESTENV_DIR"] = str(args.cluster.resolve())
        node = dataclasses.replace(node, own_cluster=True)
    if not 0 <= args.pod_start_delay <= 120:
        raise SystemExit(f"node: --pod-start-delay {args.pod_start_delay}: 0 to 120 seconds")
    node = dataclasses.replace(node, pod_start_delay=args.pod_start_delay)
    if args.action == "down":
        down(node)
        return
    for key, value in up(node).items():
        print(f"export {key}={value}")


if __name__ == "__main__":
    main()
