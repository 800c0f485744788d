"""A tiny kubelet for tests: runs labelled pods as local processes, one netns per pod."""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import datetime
import json
import logging
import os
import re
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import kubernetes
import urllib3

ROOT: Final = Path(__file__).resolve().parent.parent.parent
VENV_BIN: Final = ROOT / ".venv" / "bin"
LOCK_LABEL: Final = "cronlock.io/lock"
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
DEFAULT_NODE: Final = "cronlock-e2e"
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
IMAGE_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_GRACE_SECONDS: Final = 30
SIDECAR_BACKOFF_CAP_SECONDS: Final = 10.0
CLONE_NEWNET: Final = 0x40000000
API_ERRORS: Final = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError)

log = logging.getLogger("cronlock.e2e.podrunner")
_libc = ctypes.CDLL(None, use_errno=True)


class PodSetupError(Exception):
    """The pod asks for something this runner cannot give it; the pod fails with this message."""


def rfc3339(wall: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(time.time() if wall is None else wall, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- what the runner records ---------------------------------------------------------------


@dataclass
class ProcessRecord:
    """One container process from start to exit, for overlap checks (monotonic and wall)."""

    namespace: str
    pod: str
    pod_uid: str
    job: str
    lock: str
    container: str
    kind: str  # "sidecar" (restartable init), "init" or "main"
    attempt: int
    pid: int
    started_monotonic: float
    started_wall: float
    stopped_monotonic: float | None = None
    stopped_wall: float | None = None
    exit_code: int | None = None
    killed_by: str | None = None  # "liveness", "termination", "deletion", "drop", "shutdown"

    @property
    def running(self) -> bool:
        return self.stopped_monotonic is None


# --- network namespaces -----------------------------------------------------------------


def socket_in_netns(netns: str) -> socket.socket:
    """A TCP socket that lives in the network namespace at `netns` (a /proc/PID/ns/net path).

    setns(CLONE_NEWNET) changes only the calling thread, so a short-lived thread enters the
    pod's namespace, creates the socket and ends; the socket keeps its namespace for life.
    """
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def create() -> None:
        try:
            descriptor = os.open(netns, os.O_RDONLY)
            try:
                if _libc.setns(descriptor, CLONE_NEWNET) != 0:
                    number = ctypes.get_errno()
                    raise OSError(number, f"setns {netns}: {os.strerror(number)}")
            finally:
                os.close(descriptor)
            made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        except OSError as error:
            failed.append(error)

    thread = threading.Thread(target=create, name="netns-socket", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


class ApiForwarder:
    """Listens on 127.0.0.1:<api port> inside a pod's netns and relays to the real API server.

    A pod's network namespace has only its own loopback; the listening socket is created in
    it (socket_in_netns) and each accepted connection is paired with a connection this
    process opens in the host namespace. A paused API server stays paused through it.
    """

    def __init__(self, netns: str, port: int, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket_in_netns(netns)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self._closed = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="api-forwarder", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        for sock in [self._listener, *sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                inside, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                outside = socket.create_connection(self.upstream, timeout=5)
            except OSError as error:
                log.warning("forwarder: cannot reach the API server %s: %s", self.upstream, error)
                inside.close()
                continue
            with self._lock:
                self._sockets.update((inside, outside))
            threading.Thread(
                target=self._relay, args=(inside, outside), name="api-relay", daemon=True
            ).start()

    def _relay(self, inside: socket.socket, outside: socket.socket) -> None:
        peers = {inside: outside, outside: inside}
        try:
            with selectors.DefaultSelector() as selector:
                for sock in peers:
                    sock.setblocking(True)
                    selector.register(sock, selectors.EVENT_READ)
                open_directions = 2
                while open_directions and not self._closed.is_set():
                    for key, _ in selector.select(0.5):
                        source: socket.socket = key.fileobj  # type: ignore[assignment]
                        try:
                            chunk = source.recv(65536)
                        except OSError:
                            chunk = b""
                        if chunk:
                            peers[source].sendall(chunk)
                            continue
                        selector.unregister(source)
                        open_directions -= 1
                        with contextlib.suppress(OSError):
                            peers[source].shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.difference_update(peers)
            for sock in peers:
                with contextlib.suppress(OSError):
                    sock.close()


def http_probe(netns: str, port: int, path: str, timeout: float) -> tuple[bool, str]:
    """An httpGet probe from inside the pod's netns: 200-399 is success, as the kubelet says."""
    try:
        sock = socket_in_netns(netns)
    except OSError as error:
        return False, f"cannot enter the pod network: {error}"
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "User-Agent: kube-probe/cronlock-e2e\r\nConnection: close\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n" not in head:
                chunk = sock.recv(1024)
                if not chunk:
                    break
                head += chunk
        except OSError as error:
            return False, f'Get "http://127.0.0.1:{port}{path}": {error or type(error).__name__}'
    parts = head.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or not parts[1].isdigit():
        return False, f"malformed HTTP response {head[:60]!r}"
    code = int(parts[1])
    if 200 <= code < 400:
        return True, f"HTTP probe succeeded with statuscode: {code}"
    return False, f"HTTP probe failed with statuscode: {code}"


class PodSandbox:
    """The pod's network namespace, held open by a `sleep` (the kubelet's pause container)."""

    def __init__(self, api_upstream: tuple[str, int], api_port: int) -> None:
        own = os.readlink("/proc/self/ns/net")
        self.pause = subprocess.Popen(
            ["unshare", "--net", "--", "sleep", "infinity"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.netns = f"/proc/{self.pause.pid}/ns/net"
        deadline = time.monotonic() + 10
        # Until unshare(2) has run, /proc/PID/ns/net still names the host's namespace.
        while os.readlink(self.netns) == own:
            if self.pause.poll() is not None or time.monotonic() > deadline:
                raise PodSetupError("cannot create the pod's network namespace (unshare --net)")
            time.sleep(0.01)
        subprocess.run(
            ["nsenter", f"--net={self.netns}", "ip", "link", "set", "lo", "up"], check=True
        )
        self.forwarder = ApiForwarder(self.netns, api_port, api_upstream)

    def close(self) -> None:
        self.forwarder.close()
        with contextlib.suppress(ProcessLookupError):
            self.pause.kill()
        self.pause.wait()


# --- the pod's environment ----------------------------------------------------------------


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, $$ escapes, the rest stays."""
    result: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "$" or index + 1 >= len(text):
            result.append(char)
            index += 1
            continue
        following = text[index + 1]
        if following == "$":
            result.append("$")
            index += 2
        elif following == "(":
            close = text.find(")", index + 2)
            if close < 0:
                result.append(text[index:])
                break
            name = text[index + 2 : close]
            result.append(variables.get(name, f"$({name})"))
            index = close + 1
        else:
            result.append(char)
            index += 1
    return "".join(result)


_SUBSCRIPT = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """The downward API: the fields a kubelet resolves from the pod object."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.hostIP": "127.0.0.1",
        "status.podIP": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path] or "")
    match = _SUBSCRIPT.match(path)
    if match:
        return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))
    raise PodSetupError(f"fieldRef {path!r} is not supported by the e2e pod runner")


# --- one container ------------------------------------------------------------------------


@dataclass
class Container:
    """A container of the pod and what the runner knows about it."""

    spec: dict[str, Any]
    kind: str  # "sidecar", "init" or "main"
    process: subprocess.Popen[bytes] | None = None
    record: ProcessRecord | None = None
    exited: threading.Event = field(default_factory=threading.Event)
    restart_count: int = 0
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "PodInitializing"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    kill_reason: str | None = None
    killed_by: str | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.process is not None and not self.exited.is_set()

    def exit_code(self) -> int | None:
        terminated = self.state.get("terminated")
        return None if terminated is None else int(terminated["exitCode"])

    def status(self) -> dict[str, Any]:
        running = "running" in self.state
        return {
            "name": self.name,
            "image": str(self.spec.get("image") or "none"),
            "imageID": "",
            "ready": running,
            "started": running,
            "restartCount": self.restart_count,
            "state": self.state,
            **({"lastState": self.last_state} if self.last_state else {}),
        }


# --- the pod ------------------------------------------------------------------------------


class PodWorker:
    """Runs one pod: volumes, sandbox, sidecars, init containers, containers, probes, status."""

    def __init__(self, runner: PodRunner, pod: dict[str, Any]) -> None:
        self.runner = runner
        self.pod = pod
        metadata = pod["metadata"]
        self.namespace: str = metadata["namespace"]
        self.name: str = metadata["name"]
        self.uid: str = metadata["uid"]
        labels = metadata.get("labels") or {}
        self.job: str = labels.get(JOB_NAME_LABEL, "")
        self.lock_name: str = labels.get(LOCK_LABEL, "")
        spec = pod["spec"]
        self.grace = float(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS) or 0)
        self.directory = runner.state_dir / "pods" / f"{self.namespace}_{self.name}"
        self.containers: list[Container] = [
            Container(c, "sidecar" if c.get("restartPolicy") == "Always" else "init")
            for c in spec.get("initContainers") or []
        ] + [Container(c, "main") for c in spec.get("containers") or []]
        self.sandbox: PodSandbox | None = None
        self.volumes: dict[str, Path] = {}
        self.phase = "Pending"
        self.message = ""
        self.reason = ""
        self.started_wall = time.time()
        self.conditions: dict[str, tuple[str, str]] = {}
        self.interrupt: str | None = None
        self.delete_grace: float | None = None
        self._stopping_sidecars = False
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"pod-{self.name}", daemon=True)

    # -- control from outside --

    def start(self) -> None:
        self._thread.start()

    def request_delete(self, grace: float | None) -> None:
        """A graceful deletion: stop the containers within the grace, confirm, forget."""
        with self._changed:
            if self.interrupt in (None, "deleted"):
                self.interrupt = "deleted"
                self.delete_grace = grace if grace is not None else self.grace
            self._changed.notify_all()

    def shutdown(self) -> None:
        with self._changed:
            if self.interrupt is None:
                self.interrupt = "shutdown"
            self._changed.notify_all()

    def drop(self) -> None:
        """Node loss: SIGKILL every process of the pod at once; no teardown, no status."""
        with self._changed:
            self.interrupt = "dropped"
            processes = [c.process for c in self.containers if c.running and c.process]
            for container in self.containers:
                if container.running:
                    container.killed_by = "drop"
            self._changed.notify_all()
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if self.sandbox is not None:
            self.sandbox.close()
        for container in self.containers:
            if container.process is not None:
                container.exited.wait(5)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    # -- the lifecycle --

    def _main(self) -> None:
        try:
            self._run()
        except (PodSetupError, *API_ERRORS, subprocess.SubprocessError) as error:
            log.error("pod %s/%s failed to run: %s", self.namespace, self.name, error)
            with self._lock:
                self.reason, self.message = "RunnerError", str(error)
            self._stop_all(self.grace, "termination")
            self._finish()
        finally:
            if self.sandbox is not None and self.interrupt != "dropped":
                self.sandbox.close()
            self.finished.set()

    def _run(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._prepare_volumes()
        self._set_condition("PodScheduled", "True")
        self._set_condition("PodReadyToStartContainers", "False")
        self._set_condition("Initialized", "False")
        self._set_condition("ContainersReady", "False")
        self._set_condition("Ready", "False")
        self.sandbox = PodSandbox(self.runner.api_upstream, self.runner.api_upstream[1])
        self._set_condition("PodReadyToStartContainers", "True")
        self._publish()

        failed_init = False
        for container in [c for c in self.containers if c.kind != "main"]:
            if self.interrupt:
                break
            self._start(container)
            if container.kind == "sidecar":
                continue
            self._wait_for({container.name})
            if self.interrupt:
                break
            if container.exit_code() != 0:
                failed_init = True
                break

        mains = [c for c in self.containers if c.kind == "main"]
        if not failed_init and not self.interrupt:
            self._set_condition("Initialized", "True")
            with self._lock:
                self.phase = "Running"
            for container in mains:
                container.state = {"waiting": {"reason": "ContainerCreating"}}
                self._start(container)
            self._set_condition("ContainersReady", "True")
            self._set_condition("Ready", "True")
            self._publish()
            for container in mains:
                if "livenessProbe" in container.spec:
                    threading.Thread(
                        target=self._probe_liveness,
                        args=(container,),
                        name=f"probe-{self.name}-{container.name}",
                        daemon=True,
                    ).start()
            self._wait_for({c.name for c in mains})
        self._terminate()

    def _terminate(self) -> None:
        if self.interrupt == "dropped":
            return
        grace = self.grace
        if self.interrupt == "deleted" and self.delete_grace is not None:
            grace = self.delete_grace
        elif self.interrupt == "shutdown":
            grace = min(grace, 5.0)
        self._stop_all(grace, "deletion" if self.interrupt == "deleted" else "termination")
        self._finish()

    def _stop_all(self, grace: float, why: str) -> None:
        """Regular containers first (SIGTERM, then SIGKILL at the grace), then sidecars in
        reverse order, all within one grace period, as the kubelet does."""
        deadline = time.monotonic() + grace
        regular = [c for c in self.containers if c.kind != "sidecar" and c.running]
        for container in regular:
            self._signal(container, signal.SIGTERM, why)
        for container in regular:
            self._await_or_kill(container, deadline)
        with self._lock:
            self._stopping_sidecars = True
        for container in reversed([c for c in self.containers if c.kind == "sidecar"]):
            if container.running:
                self._signal(container, signal.SIGTERM, why)
                self._await_or_kill(container, deadline)

    def _finish(self) -> None:
        if self.interrupt in ("dropped", "shutdown"):
            return
        mains = [c for c in self.containers if c.kind == "main"]
        with self._lock:
            succeeded = (
                not self.reason
                and not self.interrupt
                and bool(mains)
                and all(c.exit_code() == 0 for c in mains)
            )
            self.phase = "Succeeded" if succeeded else "Failed"
        self._set_condition("ContainersReady", "False")
        self._set_condition("Ready", "False")
        self._publish()
        if self.interrupt == "deleted":
            self.runner.statuses.flush((self.namespace, self.name), timeout=30)
            self.runner.confirm_deletion(self.namespace, self.name, self.uid)

    def _wait_for(self, names: set[str]) -> None:
        with self._changed:
            while not self.interrupt and not all(
                c.exited.is_set() for c in self.containers if c.name in names
            ):
                self._changed.wait(0.5)

    # -- processes --

    def _start(self, container: Container) -> None:
        spec = container.spec
        env = self._environment(spec)
        command = [
            expand(part, env) for part in [*(spec.get("command") or []), *(spec.get("args") or [])]
        ]
        if not spec.get("command"):
            raise PodSetupError(
                f"container {container.name}: images are not pulled here, so the command "
                "must be given in the pod spec"
            )
        uid, gid = self._user(spec)
        script = self._setup_script(spec, uid, gid)
        argv = [
            "nsenter",
            f"--net={self.sandbox.netns if self.sandbox else '/proc/self/ns/net'}",
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            container.name,
            *command,
        ]
        log_path = self.directory / f"{container.name}.log"
        with self._lock:
            if self.interrupt:
                return
            with open(log_path, "ab") as output:
                process = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=spec.get("workingDir") or "/",
                )
            record = ProcessRecord(
                namespace=self.namespace,
                pod=self.name,
                pod_uid=self.uid,
                job=self.job,
                lock=self.lock_name,
                container=container.name,
                kind=container.kind,
                attempt=container.restart_count,
                pid=process.pid,
                started_monotonic=time.monotonic(),
                started_wall=time.time(),
            )
            container.process, container.record = process, record
            exited = container.exited = threading.Event()
            container.kill_reason = container.killed_by = None
            container.state = {"running": {"startedAt": rfc3339(record.started_wall)}}
        self.runner.record(record, "start")
        threading.Thread(
            target=self._reap,
            args=(container, process, record, exited),
            name=f"reap-{self.name}",
            daemon=True,
        ).start()
        self._publish()

    def _reap(
        self,
        container: Container,
        process: subprocess.Popen[bytes],
        record: ProcessRecord,
        exited: threading.Event,
    ) -> None:
        code = process.wait()
        stopped_monotonic, stopped_wall = time.monotonic(), time.time()
        # The container is gone once its first process is: take the rest of its group too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        exit_code = 128 - code if code < 0 else code
        with self._changed:
            record.stopped_monotonic, record.stopped_wall = stopped_monotonic, stopped_wall
            record.exit_code, record.killed_by = exit_code, container.killed_by
            terminated: dict[str, Any] = {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": rfc3339(record.started_wall),
                "finishedAt": rfc3339(stopped_wall),
            }
            if container.kill_reason:
                terminated["message"] = container.kill_reason
            container.state = {"terminated": terminated}
            exited.set()
            self._changed.notify_all()
            restart = (
                container.kind == "sidecar" and not self.interrupt and not self._stopping_sidecars
            )
        self.runner.record(record, "stop")
        self._publish()
        if restart:
            try:
                self._restart_sidecar(container)
            except (PodSetupError, OSError, subprocess.SubprocessError) as error:
                log.error(
                    "pod %s/%s: cannot restart %s: %s",
                    self.namespace,
                    self.name,
                    container.name,
                    error,
                )

    def _restart_sidecar(self, container: Container) -> None:
        delay = min(SIDECAR_BACKOFF_CAP_SECONDS, 2.0**container.restart_count)
        log.info(
            "pod %s/%s: sidecar %s exited, restarting in %.0fs",
            self.namespace,
            self.name,
            container.name,
            delay,
        )
        with self._changed:
            deadline = time.monotonic() + delay
            while not self.interrupt and not self._stopping_sidecars:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            if self.interrupt or self._stopping_sidecars:
                return
            container.last_state = container.state
            container.restart_count += 1
        self._start(container)

    def _signal(self, container: Container, signum: int, why: str) -> None:
        process = container.process
        if process is None or container.exited.is_set():
            return
        with self._lock:
            container.killed_by = container.killed_by or why
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)

    def _await_or_kill(self, container: Container, deadline: float) -> None:
        process = container.process
        if process is None:
            return
        if not container.exited.wait(max(0.0, deadline - time.monotonic())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            container.exited.wait(10)

    def _probe_liveness(self, container: Container) -> None:
        probe: dict[str, Any] = container.spec["livenessProbe"]
        http = probe.get("httpGet")
        exited = container.exited
        if not http:
            log.warning(
                "pod %s/%s: only httpGet liveness probes are run", self.namespace, self.name
            )
            return
        port = int(http["port"])
        path = str(http.get("path") or "/")
        period = float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        threshold = int(probe.get("failureThreshold", 3))
        grace = float(probe.get("terminationGracePeriodSeconds", self.grace))
        if exited.wait(float(probe.get("initialDelaySeconds", 0))):
            return
        failures = 0
        while not exited.is_set() and self.sandbox is not None:
            ok, message = http_probe(self.sandbox.netns, port, path, timeout)
            if exited.is_set() or self.interrupt:
                return
            failures = 0 if ok else failures + 1
            if failures >= threshold:
                reason = f"Liveness probe failed: {message}"
                log.info(
                    "pod %s/%s: container %s %s; killing it",
                    self.namespace,
                    self.name,
                    container.name,
                    reason,
                )
                with self._lock:
                    container.kill_reason = reason
                self._signal(container, signal.SIGTERM, "liveness")
                self._await_or_kill(container, time.monotonic() + grace)
                return
            exited.wait(period)

    # -- the container's view --

    def _environment(self, spec: Mapping[str, Any]) -> dict[str, str]:
        host, port = self.runner.api_upstream
        env: dict[str, str] = {
            "PATH": f"{self.runner.bin_dir}:{IMAGE_PATH}",
            "HOSTNAME": self.name,
            "HOME": "/",
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": str(port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
        }
        if spec.get("envFrom"):
            raise PodSetupError("envFrom is not supported by the e2e pod runner")
        for item in spec.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                env[item["name"]] = expand(str(item.get("value") or ""), env)
            elif "fieldRef" in source:
                env[item["name"]] = field_value(self.pod, source["fieldRef"]["fieldPath"])
            else:
                raise PodSetupError(
                    f"env {item['name']}: only value and fieldRef are supported by the runner"
                )
        return env

    def _user(self, spec: Mapping[str, Any]) -> tuple[int | None, int]:
        pod_context = self.pod["spec"].get("securityContext") or {}
        context = spec.get("securityContext") or {}
        uid = context.get("runAsUser", pod_context.get("runAsUser"))
        gid = context.get("runAsGroup", pod_context.get("runAsGroup", 0))
        return (None if uid is None else int(uid)), int(gid)

    def _setup_script(self, spec: Mapping[str, Any], uid: int | None, gid: int) -> str:
        """Bind-mount the pod's volumes where the container expects them, then become the user."""
        lines = ["set -e"]
        for mount in spec.get("volumeMounts") or []:
            source = self.volumes.get(mount["name"])
            if source is None:
                raise PodSetupError(f"volumeMount {mount['name']}: no such volume in the pod")
            if mount.get("subPath"):
                source = source / mount["subPath"]
            target = shlex.quote(mount["mountPath"])
            lines.append(f"mkdir -p {target}")
            lines.append(f"mount --bind {shlex.quote(str(source))} {target}")
            if mount.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {target}")
        if uid is None:
            lines.append('exec "$@"')
        else:
            lines.append(f'exec setpriv --reuid {uid} --regid {gid} --clear-groups -- "$@"')
        return "\n".join(lines)

    def _prepare_volumes(self) -> None:
        root = self.directory / "volumes"
        for volume in self.pod["spec"].get("volumes") or []:
            path = root / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in volume:
                path.chmod(0o777)
            elif "projected" in volume:
                mode = int(volume["projected"].get("defaultMode", 0o644))
                for source in volume["projected"].get("sources") or []:
                    self._project(path, source, mode)
            elif "configMap" in volume or "secret" in volume:
                reference = volume.get("configMap") or volume.get("secret") or {}
                self._project(path, volume, int(reference.get("defaultMode", 0o644)))
            else:
                kinds = sorted(key for key in volume if key != "name")
                raise PodSetupError(
                    f"volume {volume['name']}: {kinds} is not supported by the runner"
                )
            path.chmod(0o755 if "emptyDir" not in volume else 0o777)
            self.volumes[volume["name"]] = path

    def _project(self, directory: Path, source: Mapping[str, Any], mode: int) -> None:
        files: dict[str, bytes] = {}
        if "serviceAccountToken" in source:
            request = source["serviceAccountToken"]
            token = self.runner.mint_token(self.pod, request)
            files[request["path"]] = token.encode()
        elif "configMap" in source:
            reference = source["configMap"]
            data = self.runner.read_config_map(self.namespace, reference["name"])
            files.update(_items(reference, {k: v.encode() for k, v in data.items()}))
        elif "secret" in source:
            reference = source["secret"]
            data = self.runner.read_secret(
                self.namespace, reference.get("secretName") or reference["name"]
            )
            files.update(_items(reference, {k: base64.b64decode(v) for k, v in data.items()}))
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                if "fieldRef" not in item:
                    raise PodSetupError("downwardAPI: only fieldRef items are supported")
                files[item["path"]] = field_value(self.pod, item["fieldRef"]["fieldPath"]).encode()
        else:
            raise PodSetupError(f"projected source {sorted(source)} is not supported by the runner")
        for relative, content in files.items():
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(mode)

    # -- status --

    def _set_condition(self, kind: str, status: str) -> None:
        with self._lock:
            if self.conditions.get(kind, ("", ""))[0] != status:
                self.conditions[kind] = (status, rfc3339())

    def _publish(self) -> None:
        with self._lock:
            if self.interrupt in ("dropped", "shutdown"):
                return
            status: dict[str, Any] = {
                "phase": self.phase,
                "startTime": rfc3339(self.started_wall),
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}],
                "conditions": [
                    {"type": kind, "status": value, "lastTransitionTime": since}
                    for kind, (value, since) in self.conditions.items()
                ],
                "initContainerStatuses": [c.status() for c in self.containers if c.kind != "main"],
                "containerStatuses": [c.status() for c in self.containers if c.kind == "main"],
                "reason": self.reason or None,
                "message": self.message or None,
            }
        self.runner.statuses.submit((self.namespace, self.name), status)


def _items(reference: Mapping[str, Any], data: Mapping[str, bytes]) -> dict[str, bytes]:
    if not reference.get("items"):
        return dict(data)
    return {item["path"]: data[item["key"]] for item in reference["items"] if item["key"] in data}


# --- status writes --------------------------------------------------------------------------


class StatusWriter:
    """Writes each pod's latest status through the status subresource, retrying; latest wins."""

    def __init__(self, core: kubernetes.client.CoreV1Api) -> None:
        self.core = core
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._busy: set[tuple[str, str]] = set()
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="pod-status", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._thread.join(5)

    def submit(self, key: tuple[str, str], status: dict[str, Any]) -> None:
        with self._changed:
            self._pending[key] = status
            self._changed.notify_all()

    def discard(self, key: tuple[str, str]) -> None:
        with self._changed:
            self._pending.pop(key, None)

    def flush(self, key: tuple[str, str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while key in self._pending or key in self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    return False
                self._changed.wait(left)
        return True

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._stopped:
                    self._changed.wait()
                if self._stopped:
                    return
                key = next(iter(self._pending))
                status = self._pending.pop(key)
                self._busy.add(key)
            retry = False
            try:
                self.core.patch_namespaced_pod_status(
                    key[1],
                    key[0],
                    {"status": status},
                    _content_type="application/merge-patch+json",
                    _request_timeout=10,
                    _preload_content=False,
                )
            except kubernetes.client.ApiException as error:
                if error.status not in (404, 422):
                    retry = True
                log.log(
                    logging.WARNING if error.status == 422 else logging.DEBUG,
                    "status of pod %s/%s: %s %s",
                    *key,
                    error.status,
                    error.body,
                )
            except (urllib3.exceptions.HTTPError, OSError) as error:
                log.debug("status of pod %s/%s: %s", *key, error)
                retry = True
            with self._changed:
                self._busy.discard(key)
                if retry and key not in self._pending:
                    self._pending[key] = status
                self._changed.notify_all()
                if retry:
                    self._changed.wait(0.5)


# --- the runner -----------------------------------------------------------------------------


class PodRunner:
    """Registers a Ready Node, binds labelled pods of the served namespaces and runs them."""

    def __init__(
        self,
        kubeconfig: Path,
        state_dir: Path,
        namespaces: Iterable[str] = (),
        node: str = DEFAULT_NODE,
        bin_dir: Path = VENV_BIN,
    ) -> None:
        self.kubeconfig = kubeconfig
        # Containers start in /: a relative state dir would not be found from there.
        self.state_dir = state_dir.resolve()
        self.node = node
        self.bin_dir = bin_dir
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = 32
        self.api = kubernetes.client.ApiClient(configuration)
        self.core = kubernetes.client.CoreV1Api(self.api)
        server = urlsplit(configuration.host)
        self.api_upstream = (server.hostname or "127.0.0.1", server.port or 443)
        self.statuses = StatusWriter(self.core)
        self.records: list[ProcessRecord] = []
        self.journal = state_dir / "processes.jsonl"
        self._namespaces: set[str] = set(namespaces)
        self._workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="pod-watch", daemon=True)

    # -- lifecycle --

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._register_node()
        self.statuses.start()
        self._watcher.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.shutdown()
        for worker in workers:
            worker.join(15)
        self.statuses.stop()
        self.api.close()

    def serve(self, namespace: str) -> None:
        """Run the labelled pods of `namespace` from now on."""
        with self._lock:
            self._namespaces.add(namespace)

    # -- what tests look at --

    def drop(self, namespace: str, pod: str) -> None:
        """Node loss for one pod: its processes die by SIGKILL; nothing is reported, ever."""
        worker = self.worker(namespace, pod)
        self.statuses.discard((namespace, pod))
        worker.drop()

    def worker(self, namespace: str, pod: str) -> PodWorker:
        with self._lock:
            for worker in self._workers.values():
                if worker.namespace == namespace and worker.name == pod:
                    return worker
        raise KeyError(f"pod {namespace}/{pod} is not run by this runner")

    def pods(self, namespace: str) -> list[PodWorker]:
        with self._lock:
            return [w for w in self._workers.values() if w.namespace == namespace]

    def processes(self, namespace: str, container: str | None = None) -> list[ProcessRecord]:
        with self._lock:
            return [
                r
                for r in self.records
                if r.namespace == namespace and (container is None or r.container == container)
            ]

    def log(self, namespace: str, pod: str, container: str) -> str:
        path = self.state_dir / "pods" / f"{namespace}_{pod}" / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def record(self, record: ProcessRecord, event: str) -> None:
        with self._lock:
            if event == "start":
                self.records.append(record)
            with open(self.journal, "a", encoding="utf-8") as journal:
                journal.write(json.dumps({"event": event, **asdict(record)}) + "\n")

    # -- API --

    def mint_token(self, pod: Mapping[str, Any], request: Mapping[str, Any]) -> str:
        """A TokenRequest for the pod's ServiceAccount, bound to the pod, as the kubelet asks."""
        metadata = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": int(request.get("expirationSeconds", 3600)),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": metadata["name"],
                "uid": metadata["uid"],
            },
        }
        if request.get("audience"):
            spec["audiences"] = [request["audience"]]
        response = self.core.create_namespaced_service_account_token(
            account, metadata["namespace"], {"spec": spec}, _preload_content=False
        )
        return str(json.loads(response.data)["status"]["token"])

    def read_config_map(self, namespace: str, name: str) -> dict[str, str]:
        return self._read_with_retry(
            lambda: self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
        )

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        return self._read_with_retry(
            lambda: self.core.read_namespaced_secret(name, namespace, _preload_content=False)
        )

    def _read_with_retry(self, read: Callable[[], Any]) -> dict[str, str]:
        # A fresh namespace gets kube-root-ca.crt a moment after it exists; the kubelet waits.
        deadline = time.monotonic() + 30
        while True:
            try:
                data: dict[str, str] = json.loads(read().data).get("data") or {}
                return data
            except kubernetes.client.ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def confirm_deletion(self, namespace: str, name: str, uid: str) -> None:
        with contextlib.suppress(kubernetes.client.ApiException):
            self.core.delete_namespaced_pod(
                name,
                namespace,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                _preload_content=False,
            )

    def _register_node(self) -> None:
        labels = {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux"}
        try:
            self.core.create_node({"metadata": {"name": self.node, "labels": labels}})
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
        now = rfc3339()
        capacity = {"cpu": str(os.cpu_count() or 1), "memory": "8Gi", "pods": "110"}
        self.core.patch_node_status(
            self.node,
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "cronlock e2e pod runner is running",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                    "nodeInfo": {
                        "architecture": "amd64",
                        "bootID": "",
                        "containerRuntimeVersion": "cronlock-e2e://local-processes",
                        "kernelVersion": os.uname().release,
                        "kubeProxyVersion": "",
                        "kubeletVersion": "cronlock-e2e",
                        "machineID": "",
                        "operatingSystem": "linux",
                        "osImage": "local processes",
                        "systemUUID": "",
                    },
                }
            },
            _content_type="application/merge-patch+json",
        )

    def _watch(self) -> None:
        selector = LOCK_LABEL
        while not self._stopped.is_set():
            try:
                listing = json.loads(
                    self.core.list_pod_for_all_namespaces(
                        label_selector=selector, _preload_content=False, _request_timeout=30
                    ).data
                )
                for pod in listing.get("items") or []:
                    self._handle("ADDED", pod)
                watch = kubernetes.watch.Watch()
                for event in watch.stream(
                    self.core.list_pod_for_all_namespaces,
                    label_selector=selector,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=30,
                    _request_timeout=60,
                ):
                    if self._stopped.is_set():
                        watch.stop()
                        break
                    if event["type"] == "ERROR":
                        break
                    self._handle(event["type"], event["raw_object"])
            except (*API_ERRORS, ValueError) as error:
                if not self._stopped.is_set():
                    log.info("pod watch interrupted (%s); listing again", error)
                    self._stopped.wait(0.5)

    def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        namespace, uid = metadata.get("namespace", ""), metadata.get("uid", "")
        with self._lock:
            if namespace not in self._namespaces or self._stopped.is_set():
                return
            worker = self._workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.request_delete(0)
            return
        if metadata.get("deletionTimestamp"):
            if worker is not None and worker.interrupt == "dropped":
                # A lost node never answers; the pod garbage collector would force it.
                self.confirm_deletion(namespace, metadata["name"], uid)
            elif worker is not None:
                worker.request_delete(metadata.get("deletionGracePeriodSeconds"))
            return
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        if worker is not None or spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return
        if not self._bind(namespace, metadata["name"], uid):
            return
        spec["nodeName"] = self.node
        worker = PodWorker(self, pod)
        with self._lock:
            self._workers[uid] = worker
        log.info("pod %s/%s bound to %s", namespace, metadata["name"], self.node)
        worker.start()

    def _bind(self, namespace: str, name: str, uid: str) -> bool:
        try:
            self.core.create_namespaced_pod_binding(
                name,
                namespace,
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name, "uid": uid},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
                },
                _preload_content=False,
            )
        except kubernetes.client.ApiException as error:
            if error.status in (404, 409):
                return False
            raise
        return True


def main(argv: list[str] | None = None) -> int:
    """Run as a process (the demo's --keep): until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--namespace", action="append", default=[], required=True)
    parser.add_argument("--node", default=DEFAULT_NODE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    runner = PodRunner(args.kubeconfig, args.state_dir, args.namespace, args.node)
    runner.start()
    print("pod runner started", flush=True)
    stop.wait()
    runner.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
