"""Lease requests on our own HTTP/1.1 client.

The kubernetes package alone costs more than our memory goal, and `http.client` (with the
`email` parser it imports) a large part of a run's start-up; see `transport.http11`.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import quote

from cronlock_sidecar.transport.http11 import Connection, ConnectionClosed, ProtocolError
from cronlock_sidecar.transport.kubeconfig import Cluster
from cronlock_sidecar.transport.seam import (
    ApiError,
    Conflict,
    Forbidden,
    Lease,
    LeaseRef,
    NotFound,
    Unavailable,
)

USER_AGENT = "cronlock-sidecar"
DEFAULT_TIMEOUT = 5.0
# A kept-alive connection the server closed in the meantime fails on first use like this.
_STALE = (ConnectionClosed, ConnectionResetError, BrokenPipeError)


class KubeLeaseClient:
    """LeaseTransport over HTTPS with keep-alive; every request has a timeout."""

    def __init__(self, cluster: Cluster, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        return self._request("get", "GET", _lease_path(lease), lease, None, timeout)

    def create(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(lease.namespace)}/leases"
        return self._request("create", "POST", path, lease, body, timeout)

    def replace(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        return self._request("update", "PUT", _lease_path(lease), lease, body, timeout)

    def __enter__(self) -> KubeLeaseClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _connection(self, timeout: float) -> tuple[Connection, bool]:
        """A kept-alive connection if one is idle, else a new one (it connects on first use)."""
        with self._lock:
            if self._idle:
                connection = self._idle.pop()
                connection.timeout = timeout
                return connection, True
        cluster = self.cluster
        context = None
        if cluster.scheme == "https":
            context = cluster.ssl_context or ssl.create_default_context()
        connection = Connection(
            cluster.host,
            cluster.port,
            ssl_context=context,
            timeout=timeout,
            server_hostname=cluster.tls_server_name,
            proxy=cluster.proxy,
        )
        return connection, False

    def _request(
        self,
        verb: str,
        method: str,
        path: str,
        lease: LeaseRef,
        body: Lease | None,
        timeout: float | None,
    ) -> Lease:
        limit = self.timeout if timeout is None else max(0.05, min(timeout, self.timeout))
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            token = self.cluster.bearer_token()
        except OSError as error:
            raise Unavailable(verb, lease, f"cannot get a token: {error}") from error
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = self.cluster.base_path + path
        deadline = time.monotonic() + limit
        while True:
            status, answer_headers, raw = self._send(
                verb, method, url, headers, payload, lease, limit
            )
            # 429 (priority and fairness, or a webhook's rate limit): wait as told, within
            # this request's own time budget, then ask again.
            wait = _retry_after(answer_headers) if status == 429 else None
            if wait is None or time.monotonic() + wait >= deadline:
                return _answer(verb, lease, status, raw)
            time.sleep(wait)

    def _send(
        self,
        verb: str,
        method: str,
        url: str,
        headers: dict[str, str],
        payload: bytes | None,
        lease: LeaseRef,
        limit: float,
    ) -> tuple[int, dict[str, str], bytes]:
        for attempt in (1, 2):
            connection, reused = self._connection(limit)
            try:
                status, answer_headers, raw, will_close = connection.request(
                    method, url, headers, payload
                )
            except _STALE as error:
                connection.close()
                if reused and attempt == 1:
                    continue
                raise Unavailable(verb, lease, f"{self.cluster.server}: {error}") from error
            except (OSError, ProtocolError) as error:  # ssl.SSLError is an OSError
                connection.close()
                detail = "timed out" if isinstance(error, socket.timeout) else str(error)
                raise Unavailable(
                    verb, lease, f"{self.cluster.server}: {detail or type(error).__name__}"
                ) from error
            if will_close:
                connection.close()
            else:
                with self._lock:
                    self._idle.append(connection)
            return status, answer_headers, raw
        raise Unavailable(verb, lease, "connection closed twice")


def _retry_after(headers: dict[str, str]) -> float | None:
    """Retry-After in seconds (the API server sends whole seconds); None if absent or odd."""
    value = headers.get("retry-after", "").strip()
    if not value.isdigit():
        return None
    return min(float(value), 10.0)


def _lease_path(lease: LeaseRef) -> str:
    return (
        f"/apis/coordination.k8s.io/v1/namespaces/{quote(lease.namespace)}"
        f"/leases/{quote(lease.name)}"
    )


def _answer(verb: str, lease: LeaseRef, status: int, raw: bytes) -> Lease:
    try:
        document: Any = json.loads(raw) if raw else {}
    except ValueError:
        document = {}
    if 200 <= status < 300:
        if not isinstance(document, dict):
            raise Unavailable(verb, lease, f"HTTP {status}: the answer is not a JSON object")
        return document
    message = document.get("message") if isinstance(document, dict) else None
    detail = f"HTTP {status}: {message or raw[:200].decode('utf-8', 'replace').strip()}"
    error_class: type[ApiError]
    if status == 404:
        error_class = NotFound
    elif status == 409:
        error_class = Conflict
    elif status in {401, 403}:
        error_class = Forbidden
    else:
        error_class = Unavailable
    raise error_class(verb, lease, detail)
