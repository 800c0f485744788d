"""The real node as whatever runs pods sees it (the e2e ring, the pod-mode reliability
checker `tests.reliability.pods`, the demo): its processes, its faults, what ran on it.

`RealNode` starts and stops `tests/controlplane/node` (kubelet, containerd, runc) and
injects faults from the host: cut the pods' path to the API server, SIGSTOP or SIGKILL a
container's process, stop and restart the kubelet. `WorkTracker` sees when each run's
work really starts and stops: the main container keeps a TCP connection to it open for
exactly as long as the container's processes live (the kernel closes it when they die,
whatever killed them). `PodRecorder` keeps every pod it saw and its last status, so a
test can read a gate's exit code after the operator deleted a skipped Job.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from tests.support.contract import GATE_CONTAINER, SIDECAR_CONTAINER
from tests.support.kube import wait_for
from tests.support.paths import ROOT

NODE_SCRIPT = ROOT / "tests" / "controlplane" / "node"
# The host's end of the link to node 1: pods of every node reach the tracker there.
HOST_LINK_IP = "198.51.100.1"
# The host's end of node 2's link, where its kubelet's relay listens.
NODE2_HOST_LINK_IP = "198.51.100.5"
# ... and of nodes 3, 4 and 5's, each a cluster's own (`cluster`): their pods reach the
# host there, and nowhere else.
HOST_LINK_IPS = {
    1: HOST_LINK_IP,
    2: NODE2_HOST_LINK_IP,
    3: "198.51.100.9",
    4: "198.51.100.13",
    5: "198.51.100.17",
}
# The Service range: the pods' path to the API server (tests/controlplane/node.py).
SERVICE_CIDR = "203.0.113.0/25"
CRONLOCK_IMAGE = "localhost/cronlock:dev"
# Debian's busybox-static as an image (tests/controlplane/images), imported into the node's
# containerd: the CronJobs' main containers run it; there is no registry to pull from.
BUSYBOX_IMAGE = "localhost/busybox:cronlock"
# What a watch may raise while the API server is away (a paused one times reads out).
WATCH_ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


# Which node an e2e session runs its pods on (tests/e2e/conftest.py): 1 (the default, with
# node 2 and the registry) or 5 (a cluster of its own: tests/rings.py's second e2e ring).
E2E_NODE_ENV = "CRONLOCK_E2E_NODE"
E2E_CLUSTER_NODES = (5,)


def e2e_node_index(environ: Mapping[str, str] | None = None) -> int:
    """CRONLOCK_E2E_NODE: 1 (unset or empty) or a cluster node's index; else a clear error."""
    value = (os.environ if environ is None else environ).get(E2E_NODE_ENV, "").strip()
    if value in ("", "1"):
        return 1
    if value.isdigit() and int(value) in E2E_CLUSTER_NODES:
        return int(value)
    allowed = ", ".join(str(index) for index in (1, *E2E_CLUSTER_NODES))
    raise ValueError(f"{E2E_NODE_ENV}={value!r}: the e2e node is one of {allowed}")


@dataclass
class RealNode:
    """A node started for this test session (node 1, or another of the fleet: `index`),
    and the faults a test can inject on it. With `cluster` (a control plane's test
    environment directory) it is that control plane's only node, with its own scheduler and
    pods' relay (`node up --cluster`); `pod_start_delay`: its pods start that late."""

    env: dict[str, str]
    index: int = 1
    cluster: Path | None = None
    pod_start_delay: float = 0.0
    state: Path = field(init=False)
    name: str = field(init=False)
    # The OCI registry on the node's network, host:port (tests/controlplane/node).
    registry: str = field(init=False)

    @property
    def _index_args(self) -> list[str]:
        args = ["--index", str(self.index)]
        if self.cluster is not None:
            args += ["--cluster", str(self.cluster)]
        if self.pod_start_delay:
            args += ["--pod-start-delay", str(self.pod_start_delay)]
        return args

    def start(self) -> None:
        result = subprocess.run(
            [str(NODE_SCRIPT), "up", *self._index_args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"tests/controlplane/node up failed:\n{result.stderr[-4000:]}")
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in result.stdout.splitlines()
            if line.startswith("export ")
        )
        self.state = Path(exports["CRONLOCK_NODE_DIR"])
        self.name = exports["CRONLOCK_NODE_NAME"]
        self.registry = exports["CRONLOCK_REGISTRY"]

    def stop(self) -> None:
        subprocess.run(
            [str(NODE_SCRIPT), "down", *self._index_args],
            env=self.env,
            capture_output=True,
            check=False,
        )

    def pid(self, component: str) -> int:
        return int((self.state / f"{component}.pid").read_text())

    # -- faults --

    @contextmanager
    def pods_cut_off(self) -> Iterator[None]:
        """The pods' path to the API server hangs (their relay is stopped); the kubelet's works."""
        os.kill(self.pid("pod-relay"), signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.pid("pod-relay"), signal.SIGCONT)

    def cut_pods_off(self) -> None:
        os.kill(self.pid("pod-relay"), signal.SIGSTOP)

    def reconnect_pods(self) -> None:
        os.kill(self.pid("pod-relay"), signal.SIGCONT)

    @contextmanager
    def partitioned(self) -> Iterator[None]:
        """This node cut off from the API server, its kubelet alive: its kubelet's relay
        paused (the kubelet's connections hang) and the Service range blackholed in its
        namespace (its pods' connections hang too; other nodes' pods are not touched). Its
        link to the host stays, so the work tracker still hears when its work stops."""
        netns = ["nsenter", f"--net=/run/netns/{self.name}", "--"]
        relay = self.pid("node-relay")
        os.killpg(relay, signal.SIGSTOP)
        subprocess.run([*netns, "ip", "route", "replace", "blackhole", SERVICE_CIDR], check=True)
        try:
            yield
        finally:
            subprocess.run(
                [*netns, "ip", "route", "replace", SERVICE_CIDR, "via", self.host_link_ip],
                check=True,
            )
            os.killpg(relay, signal.SIGCONT)

    @property
    def host_link_ip(self) -> str:
        return HOST_LINK_IPS[self.index]

    def stop_kubelet(self) -> None:
        """SIGKILL the kubelet: the node is lost; its containers keep running under containerd."""
        pid = self.pid("kubelet")
        os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, "the kubelet to die")

    def stop_containerd(self) -> None:
        """SIGKILL containerd, as a runtime crash: the containers go on under their shims."""
        pid = self.pid("containerd")
        os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, "containerd to die")

    def start_containerd(self) -> None:
        self.start_kubelet()  # `node up` starts whichever of the two is gone

    def start_kubelet(self) -> None:
        result = subprocess.run(
            [str(NODE_SCRIPT), "up", *self._index_args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"restarting the kubelet failed:\n{result.stderr[-4000:]}")

    def container_pid(self, pod_uid: str, container: str) -> int:
        """The host pid of a running container's first process (its PID 1)."""
        for status in self._containers():
            labels = status.get("labels") or {}
            if (
                labels.get("io.kubernetes.pod.uid") == pod_uid
                and labels.get("io.kubernetes.container.name") == container
                and status.get("state") == "CONTAINER_RUNNING"
            ):
                info = self._crictl("inspect", status["id"])
                return int(json.loads(info)["info"]["pid"])
        raise LookupError(f"no running container {container} in pod {pod_uid}")

    def signal_container(
        self, pod_uid: str, container: str, signum: signal.Signals, caught: bool = False
    ) -> int:
        """Send `signum` to the container's PID 1. `caught`: first wait until that process
        has a handler for it: a namespace's init ignores a signal it has none for, so a
        shell's `trap` not yet run would lose it (the tracker sees a work start as soon as
        the script's first line has run, before the rest)."""
        pid = self.container_pid(pod_uid, container)
        if caught:
            wait_for(lambda: catches(pid, signum), 30, f"pid {pid} to catch {signum.name}")
        os.kill(pid, signum)
        return pid

    def container_times(self, pod_uid: str) -> dict[str, dict[str, float]]:
        """When containerd created, started and ended each container of the pod (and its
        sandbox, as `sandbox`), in seconds of the host's wall clock, nanosecond precise
        (the pod's status has whole seconds only)."""
        times: dict[str, dict[str, float]] = {}
        for sandbox in json.loads(self._crictl("pods", "-o", "json"))["items"]:
            if (sandbox.get("metadata") or {}).get("uid") == pod_uid:
                times["sandbox"] = {"created": int(sandbox["createdAt"]) / 1e9}
        for status in self._containers():
            labels = status.get("labels") or {}
            if labels.get("io.kubernetes.pod.uid") != pod_uid:
                continue
            info = json.loads(self._crictl("inspect", status["id"]))["status"]
            times[labels["io.kubernetes.container.name"]] = {
                key: _epoch(info.get(f"{key}At")) for key in ("created", "started", "finished")
            }
        return times

    def _containers(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = json.loads(self._crictl("ps", "-a", "-o", "json"))[
            "containers"
        ]
        return listed

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into the node's containerd (`ctr images import`), as
        `node up` imports the images it starts with."""
        sock = f"/run/{self.name}/containerd.sock"
        self._in_node(
            "ctr", "--address", sock, "-n", "k8s.io", "images", "import", "--local", str(archive)
        )

    def _crictl(self, *args: str) -> str:
        sock = f"unix:///run/{self.name}/containerd.sock"
        return self._in_node("crictl", "--runtime-endpoint", sock, "--image-endpoint", sock, *args)

    def _in_node(self, tool: str, *args: str) -> str:
        """A node binary of the control plane's build run in the node's network namespace;
        its output."""
        bins = Path(os.readlink(self.env_dir_bin("kubectl"))).parent
        result = subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.name}", "--", str(bins / tool), *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    def env_dir_bin(self, tool: str) -> Path:
        return self.state.parent / "bin" / tool


@dataclass
class Work:
    """One run's work as the tracker saw it, on this host's monotonic clock."""

    pod: str
    started: float
    stopped: float | None = None

    @property
    def running(self) -> bool:
        return self.stopped is None


class WorkTracker:
    """A TCP server the main containers keep a connection to while their work runs, on
    `host` (the host's end of node 1's link by default: every fleet node's pods reach it;
    a cluster node's pods reach only their own link's)."""

    def __init__(self, host: str = HOST_LINK_IP) -> None:
        self.host = host
        self._server = socket.create_server((host, 0))
        self.port = int(self._server.getsockname()[1])
        self._lock = threading.Lock()
        self._works: list[Work] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.close()

    def shell_prefix(self) -> str:
        """Put before a container's `sh -c` script: connect, name the pod, hold on.

        The connection belongs to the container's processes: it closes when the script
        ends (PID 1 exits and the kernel ends the rest) or when anything kills them.
        """
        return f"(echo $HOSTNAME; exec sleep 2147483647) | nc {self.host} {self.port} & "

    def works(self, prefix: str = "") -> list[Work]:
        with self._lock:
            return [w for w in self._works if w.pod.startswith(prefix)]

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            started = time.monotonic()
            threading.Thread(target=self._follow, args=(connection, started), daemon=True).start()

    def _follow(self, connection: socket.socket, started: float) -> None:
        with connection:
            name = b""
            while not name.endswith(b"\n"):
                chunk = connection.recv(256)
                if not chunk:
                    return
                name += chunk
            work = Work(name.decode().strip(), started)
            with self._lock:
                self._works.append(work)
            while connection.recv(256):
                pass
            work.stopped = time.monotonic()


def overlapping(works: list[Work]) -> list[tuple[Work, Work]]:
    """Pairs of works whose [start, stop] intervals intersect (a running one lasts forever)."""
    pairs = []
    ordered = sorted(works, key=lambda work: work.started)
    for index, first in enumerate(ordered):
        end = first.stopped if first.stopped is not None else float("inf")
        for second in ordered[index + 1 :]:
            if second.started < end:
                pairs.append((first, second))
    return pairs


def crowded(works: list[Work], permits: int) -> list[tuple[Work, ...]]:
    """Each moment more than `permits` works ran at once: the works running then, oldest
    first (a sweep over starts and stops; a running one lasts forever, and a work that
    starts as another stops does not meet it, as in `overlapping`). With `permits` 1 there
    is a moment for each work that started while another ran."""
    moments: list[tuple[Work, ...]] = []
    edges = sorted(
        [(work.started, 1, index) for index, work in enumerate(works)]
        + [(work.stopped, 0, index) for index, work in enumerate(works) if work.stopped is not None]
    )
    running: dict[int, Work] = {}
    for _, starts, index in edges:
        if not starts:
            running.pop(index, None)
            continue
        running[index] = works[index]
        if len(running) > permits:
            moments.append(tuple(sorted(running.values(), key=lambda work: work.started)))
    return moments


class PodRecorder:
    """Every pod of a namespace, as last seen by a watch (kept after the pod is deleted)."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self._core = kubernetes.client.CoreV1Api(api)
        self._namespace = namespace
        self._pods: dict[str, dict[str, Any]] = {}
        self._sidecar_logs: dict[str, str] = {}
        self._order: list[str] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._api = api
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def pods(self, job: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            pods = [self._pods[name] for name in self._order]
        return [pod for pod in pods if job is None or job_of(pod) == job]

    def sidecar_log(self, pod: str) -> str:
        """The `cronlock` container's log: live, else as read when the gate had decided."""
        try:
            log: str = self._core.read_namespaced_pod_log(
                pod, self._namespace, container=SIDECAR_CONTAINER
            )
        except kubernetes.client.ApiException as error:
            if error.status not in (400, 404):
                raise
            with self._lock:
                return self._sidecar_logs.get(pod, "")
        return log or ""  # the client gives None for an empty log

    def _keep_decision_log(self, pod: dict[str, Any]) -> None:
        # A skipped run's Job (and with it the pod and its logs) is deleted by the
        # operator moments after the gate exits: read the sidecar's log at once.
        name = pod["metadata"]["name"]
        if name in self._sidecar_logs or exit_code(pod, GATE_CONTAINER) is None:
            return
        try:
            log = self._core.read_namespaced_pod_log(
                name, self._namespace, container=SIDECAR_CONTAINER
            )
        except kubernetes.client.ApiException:
            return
        with self._lock:
            self._sidecar_logs[name] = log

    def _watch(self) -> None:
        follow(self._core.list_namespaced_pod, self._namespace, self._stopped, self._seen)

    def _seen(self, kind: str, raw: Any) -> None:
        pod = self._api.sanitize_for_serialization(raw)
        name = pod["metadata"]["name"]
        with self._lock:
            if name not in self._pods:
                self._order.append(name)
            self._pods[name] = pod
        if kind != "DELETED":
            self._keep_decision_log(pod)


def follow(
    list_objects: Callable[..., Any],
    namespace: str,
    stopped: threading.Event,
    seen: Callable[[str, Any], None],
) -> None:
    """Watch a namespace's objects until `stopped`, calling `seen(event type, object)`.

    Resumes where a broken watch stopped, so no version goes unseen; only a version too
    old to resume from (410 Gone) starts over from the current state.
    """
    version = ""
    while not stopped.is_set():
        watch = kubernetes.watch.Watch()
        try:
            for event in watch.stream(
                list_objects,
                namespace,
                resource_version=version,
                timeout_seconds=5,
                _request_timeout=10,
            ):
                version = event["object"].metadata.resource_version
                seen(event["type"], event["object"])
                if stopped.is_set():
                    break
        except WATCH_ERRORS as error:
            if isinstance(error, kubernetes.client.ApiException) and error.status == 410:
                version = ""
            time.sleep(0.2)
        finally:
            watch.stop()


@dataclass(frozen=True)
class PermitEntry:
    """One permit of a Lease as a watch saw it (docs/USAGE.md "Permits"): permit 0 is the
    spec, permit K ≥ 1 the annotation `cronlock.io/permit.K`; times are wall clock."""

    number: int
    holder: str
    renew_time: float | None
    duration: float | None
    transitions: int


def permit_entries(lease: Mapping[str, Any]) -> tuple[PermitEntry, ...]:
    """Every permit of `lease` as its documented format says, read here apart from the
    sidecar's own code: N is `cronlock.io/permits` (1 when absent or no number); permit
    K's value is `<holder> <acquire> <renew> <duration s> <transitions> <job>`, `-` for
    none. An absent or malformed entry is free, with transitions 0 if unreadable."""
    spec = lease.get("spec") or {}
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    duration = spec.get("leaseDurationSeconds")
    entries = [
        PermitEntry(
            0,
            str(spec.get("holderIdentity") or ""),
            wall_time(spec.get("renewTime")),
            None if duration is None else float(duration),
            int(spec.get("leaseTransitions") or 0),
        )
    ]
    count = str(annotations.get("cronlock.io/permits") or "1").strip()
    for number in range(1, int(count) if count.isdigit() and 0 < int(count) <= 16 else 1):
        fields = str(annotations.get(f"cronlock.io/permit.{number}") or "").split(" ")
        if len(fields) != 6:
            entries.append(PermitEntry(number, "", None, None, 0))
            continue
        holder, _, renewed, seconds, transitions, _ = fields
        entries.append(
            PermitEntry(
                number,
                "" if holder == "-" else holder,
                wall_time(renewed),
                float(seconds) if seconds.isdigit() else None,
                int(transitions) if transitions.isdigit() else 0,
            )
        )
    return tuple(entries)


@dataclass(frozen=True)
class LeaseVersion:
    """One version of a Lease as a watch saw it; its times are wall clock (seconds)."""

    name: str
    holder: str
    renew_time: float | None
    duration: float | None
    last_holder: str
    released_at: float | None
    # time.time() - time.monotonic() when it was seen: a wall time minus this is the same
    # moment on this host's monotonic clock (the node shares this host's clocks).
    offset: float
    # Every permit (`permit_entries`), permit 0 first; () when not read (a test's version).
    permits: tuple[PermitEntry, ...] = ()

    @classmethod
    def of(cls, lease: dict[str, Any], offset: float) -> LeaseVersion:
        spec = lease.get("spec") or {}
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        duration = spec.get("leaseDurationSeconds")
        return cls(
            name=str(lease["metadata"]["name"]),
            holder=str(spec.get("holderIdentity") or ""),
            renew_time=wall_time(spec.get("renewTime")),
            duration=None if duration is None else float(duration),
            last_holder=str(annotations.get("cronlock.io/last-holder") or ""),
            released_at=wall_time(annotations.get("cronlock.io/released-at")),
            offset=offset,
            permits=permit_entries(lease),
        )


class LeaseRecorder:
    """Every version of a namespace's Leases a watch saw, in order (renewals included)."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self._coordination = kubernetes.client.CoordinationV1Api(api)
        self._api = api
        self._namespace = namespace
        self._versions: list[LeaseVersion] = []
        # Every event as the watch saw it, whole, with the wall time seen (evidence).
        self._documents: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def versions(self, name: str | None = None) -> list[LeaseVersion]:
        with self._lock:
            return [v for v in self._versions if name is None or v.name == name]

    def documents(self) -> list[dict[str, Any]]:
        """Every watch event whole: {"seen": wall time, "event": type, "lease": the Lease}."""
        with self._lock:
            return list(self._documents)

    def _watch(self) -> None:
        follow(self._coordination.list_namespaced_lease, self._namespace, self._stopped, self._seen)

    def _seen(self, kind: str, raw: Any) -> None:
        wall = time.time()
        offset = wall - time.monotonic()
        lease = self._api.sanitize_for_serialization(raw)
        with self._lock:
            self._documents.append({"seen": _stamp(wall), "event": kind, "lease": lease})
            if kind != "DELETED":
                self._versions.append(LeaseVersion.of(lease, offset))


def _stamp(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"


def _epoch(stamp: Any) -> float:
    """crictl's time as seconds since the epoch; NaN when unset (its zero, 1970)."""
    seconds = wall_time(stamp)
    return seconds if seconds else float("nan")


def wall_time(value: Any) -> float | None:
    """A Kubernetes timestamp (RFC 3339, MicroTime or Time) as seconds since the epoch."""
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def job_of(pod: dict[str, Any]) -> str:
    labels = pod["metadata"].get("labels") or {}
    return str(labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or "")


def container_state(pod: dict[str, Any], container: str) -> dict[str, Any]:
    """The container's `state` ({} until the kubelet reported it)."""
    status = pod.get("status") or {}
    for entry in (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    ):
        if entry["name"] == container:
            state: dict[str, Any] = entry.get("state") or {}
            return state
    return {}


def exit_code(pod: dict[str, Any], container: str) -> int | None:
    terminated = container_state(pod, container).get("terminated")
    return None if terminated is None else int(terminated["exitCode"])


def catches(pid: int, signum: signal.Signals) -> bool:
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc/PID/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False
