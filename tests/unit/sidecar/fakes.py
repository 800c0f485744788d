"""Fakes for the sidecar's edges: a clock, a Lease transport and a tiny Lease API server.

The Leases they start with come from `tests.support.leases.make_lease`; `LEASE` names its
default one."""

from __future__ import annotations

import copy
import http.server
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from cronlock_sidecar.transport.seam import Conflict, Lease, LeaseRef, NotFound
from tests.support.leases import MOMENT
from tests.support.processes import finish

START = MOMENT  # the fake clocks start when make_lease claims Leases by default
LEASE = LeaseRef("default", "cronlock-report")


class FakeClock:
    """Both clocks advance together unless a test moves one alone."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = START

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> datetime:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


class FakeTransport:
    """One Lease with resourceVersion semantics; scripted failures and races per verb."""

    def __init__(self, lease: Lease | None = None) -> None:
        self.lease: Lease | None = None
        self.version = 0
        self.calls: list[tuple[str, Lease | None]] = []
        self.failures: dict[str, list[Exception]] = {"get": [], "create": [], "replace": []}
        self.before_write: list[Callable[[FakeTransport], None]] = []
        if lease is not None:
            self.store(lease)

    def store(self, lease: Lease) -> Lease:
        self.version += 1
        stored = copy.deepcopy(lease)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.lease = stored
        return copy.deepcopy(stored)

    def fail(self, verb: str, *errors: Exception) -> None:
        self.failures[verb].extend(errors)

    def _scripted(self, verb: str) -> None:
        if self.failures[verb]:
            raise self.failures[verb].pop(0)

    def writes(self) -> list[Lease | None]:
        return [body for verb, body in self.calls if verb in {"create", "replace"}]

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        self.calls.append(("get", None))
        self._scripted("get")
        if self.lease is None:
            raise NotFound("get", lease, "leases not found")
        return copy.deepcopy(self.lease)

    def create(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        self.calls.append(("create", copy.deepcopy(body)))
        self._scripted("create")
        if self.lease is not None:
            raise Conflict("create", lease, "already exists")
        return self.store(body)

    def replace(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        self.calls.append(("replace", copy.deepcopy(body)))
        while self.before_write:
            self.before_write.pop(0)(self)
        self._scripted("replace")
        if self.lease is None:
            raise NotFound("update", lease, "leases not found")
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise Conflict("update", lease, "the object has been modified")
        return self.store(body)


SIDECAR = [sys.executable, "-m", "cronlock_sidecar.cli"]
LEASE_ARGS = ["--lease", "default/cronlock-report"]


def start_run(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SIDECAR, "run", *LEASE_ARGS, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_sidecar(env: dict[str, str], *args: str) -> tuple[int, str]:
    return finish(start_run(env, *args))


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def holder(api_server: FakeApiServer) -> str:
    lease = api_server.get_lease()
    return str(lease["spec"].get("holderIdentity", "")) if lease else ""


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


# --- a Lease API server on loopback, for the CLI and the HTTP client ------------------
_LEASE_PATH = re.compile(r"/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/?]+))?$")


class FakeApiServer:
    """Just enough of kube-apiserver for Leases: GET, POST, PUT with resourceVersion checks."""

    def __init__(self, tmp_path: Path) -> None:
        self.leases: dict[tuple[str, str], Lease] = {}
        self.version = 0
        self.requests: list[tuple[str, str]] = []
        # When each create or update from a client was stored (time.monotonic(), which the
        # sidecar's deadlines use too): what tests/support/timing.py measures from.
        self.stored_at: list[float] = []
        self.tokens_seen: list[str] = []
        self.forbidden: set[str] = set()
        # Seconds of Retry-After for the next requests, each answered 429 (one per entry).
        self.throttle: list[int] = []
        self.broken = False
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _reply(self, status: int, document: dict[str, Any]) -> None:
                payload = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                self.tokens_seen_append()
                if server.throttle:
                    wait = server.throttle.pop(0)
                    server.requests.append((method, self.path))
                    payload = b'{"kind":"Status","code":429,"reason":"TooManyRequests"}'
                    self.send_response(429)
                    self.send_header("Retry-After", str(wait))
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                status, document = server.handle(method, self.path, body)
                self._reply(status, document)

            def tokens_seen_append(self) -> None:
                server.tokens_seen.append(self.headers.get("Authorization", ""))

            def do_GET(self) -> None:
                self._handle("GET")

            def do_PUT(self) -> None:
                self._handle("PUT")

            def do_POST(self) -> None:
                self._handle("POST")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.kubeconfig = tmp_path / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                }
            )
        )

    def status(self, code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
        return code, {"kind": "Status", "status": "Failure", "reason": reason, "message": message}

    def handle(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append((method, path))
            match = _LEASE_PATH.match(path)
            if self.broken:
                return self.status(503, "ServiceUnavailable", "etcd is down")
            if match is None:
                return self.status(404, "NotFound", "no such path")
            namespace, name = match.group(1), match.group(2)
            verb = {"GET": "get", "PUT": "update", "POST": "create"}[method]
            if verb in self.forbidden:
                return self.status(
                    403, "Forbidden", f"leases.coordination.k8s.io is forbidden: cannot {verb}"
                )
            if method == "POST":
                name = body["metadata"]["name"]
                if (namespace, name) in self.leases:
                    return self.status(409, "AlreadyExists", f'leases "{name}" already exists')
                return 201, self._stored(namespace, name, body)
            current = self.leases.get((namespace, name))
            if current is None:
                return self.status(404, "NotFound", f'leases "{name}" not found')
            if method == "GET":
                return 200, copy.deepcopy(current)
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return self.status(409, "Conflict", "the object has been modified")
            return 200, self._stored(namespace, name, body)

    def _stored(self, namespace: str, name: str, body: Lease) -> Lease:
        stored = self._store(namespace, name, body)
        self.stored_at.append(time.monotonic())
        return stored

    def _store(self, namespace: str, name: str, body: Lease) -> Lease:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        stored["metadata"]["namespace"] = namespace
        self.leases[(namespace, name)] = stored
        return copy.deepcopy(stored)

    def put_lease(self, lease: Lease) -> None:
        with self.lock:
            self._store(lease["metadata"]["namespace"], lease["metadata"]["name"], lease)

    def get_lease(self, ref: LeaseRef = LEASE) -> Lease | None:
        with self.lock:
            return copy.deepcopy(self.leases.get((ref.namespace, ref.name)))

    def writes(self) -> int:
        with self.lock:
            return sum(1 for method, _ in self.requests if method in {"PUT", "POST"})

    def last_write(self) -> float:
        """When the last create or update from a client was stored (time.monotonic())."""
        with self.lock:
            assert self.stored_at, "the API server stored no write"
            return self.stored_at[-1]

    def stored_writes(self) -> int:
        with self.lock:
            return len(self.stored_at)
