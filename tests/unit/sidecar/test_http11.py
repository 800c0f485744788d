"""The sidecar's own HTTP/1.1 client against a loopback server that sends exact raw bytes."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from cronlock_sidecar.transport import http11
from cronlock_sidecar.transport.http11 import Connection, ConnectionClosed, ProtocolError
from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
from cronlock_sidecar.transport.kubeconfig import Cluster
from cronlock_sidecar.transport.seam import LeaseRef, NotFound, Unavailable

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

LEASE = LeaseRef("default", "cronlock-report")
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/default/leases/cronlock-report"


@dataclass(frozen=True)
class Stall:
    """Send these bytes (one at a time every `interval` if set), then say nothing more."""

    data: bytes = b""
    interval: float = 0.0


Step = bytes | Stall


class RawServer:
    """Loopback server: connection N answers its Nth script, one step per request read.

    After its last step the server closes the connection. A step of b"" reads the
    request and closes without answering. Connections beyond the scripts are counted
    and closed at once.
    """

    def __init__(self, *scripts: list[Step]) -> None:
        self.scripts = list(scripts)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = int(self.listener.getsockname()[1])
        self.requests: list[tuple[int, bytes]] = []  # (connection index, raw request)
        self.accepted = 0
        self.closed = [threading.Event() for _ in scripts]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            index = self.accepted
            self.accepted += 1
            if index >= len(self.scripts):
                conn.close()
                continue
            thread = threading.Thread(target=self._talk, args=(index, conn), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _talk(self, index: int, conn: socket.socket) -> None:
        conn.settimeout(10)
        buffered = b""
        try:
            for step in self.scripts[index]:
                request, buffered = _read_request(conn, buffered)
                if request is None:
                    return
                self.requests.append((index, request))
                if isinstance(step, Stall):
                    if step.interval:
                        for byte in step.data:
                            conn.sendall(bytes([byte]))
                            if self._stop.wait(step.interval):
                                return
                    else:
                        conn.sendall(step.data)
                    self._stop.wait(10)
                    return
                conn.sendall(step)
                if not step:
                    return
        except OSError:
            return  # the client gave up on a long answer; its side is what the test checks
        finally:
            conn.close()
            self.closed[index].set()

    def stop(self) -> None:
        self._stop.set()
        self.listener.close()
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(5)

    def connection(self, timeout: float = 5.0) -> Connection:
        return Connection("127.0.0.1", self.port, timeout=timeout)

    def kube_client(self, timeout: float = 5.0) -> KubeLeaseClient:
        cluster = Cluster(server=f"http://127.0.0.1:{self.port}", ssl_context=None, token="tok")  # noqa: S106
        return KubeLeaseClient(cluster, timeout=timeout)


def _read_request(conn: socket.socket, buffered: bytes) -> tuple[bytes | None, bytes]:
    """One request (head and Content-Length body) off the connection; None at its end."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        rest += chunk
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


@pytest.fixture
def serve() -> Iterator[type[RawServer]]:
    servers: list[RawServer] = []

    class Tracked(RawServer):
        def __init__(self, *scripts: list[Step]) -> None:
            super().__init__(*scripts)
            servers.append(self)

    yield Tracked
    for server in servers:
        server.stop()


def ok(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{line}\r\n" for line in extra)
    return f"HTTP/1.1 200 OK\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def lease_reply(holder: str) -> bytes:
    return ok(json.dumps({"kind": "Lease", "spec": {"holderIdentity": holder}}).encode())


# --- requests --------------------------------------------------------------------
def test_a_request_is_framed_as_http11_with_host_and_content_length(
    serve: type[RawServer],
) -> None:
    server = serve([ok(b"{}")])
    with server.connection() as connection:
        connection.request("PUT", "/a/b?c=d", {"Accept": "application/json"}, b'{"x":1}')
    ((_, request),) = server.requests
    assert request == (
        b"PUT /a/b?c=d HTTP/1.1\r\n"
        + f"Host: 127.0.0.1:{server.port}\r\n".encode()
        + b"Accept: application/json\r\nContent-Length: 7\r\n\r\n"
        + b'{"x":1}'
    )


@pytest.mark.parametrize(
    ("host", "port", "tls", "expected"),
    [
        ("api.example", 443, True, "api.example"),
        ("api.example", 6443, True, "api.example:6443"),
        ("api.example", 80, False, "api.example"),
        ("api.example", 443, False, "api.example:443"),
        ("fd00::1", 6443, True, "[fd00::1]:6443"),
        ("::1", 443, True, "[::1]"),
    ],
)
def test_the_host_header_has_the_port_unless_default_and_brackets_ipv6(
    host: str, port: int, tls: bool, expected: str
) -> None:
    context = ssl.create_default_context() if tls else None
    assert Connection(host, port, ssl_context=context).host_header == expected


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/a b", {}),
        ("/a\r\nX: y", {}),
        ("/a", {"X-Token": "abc\r\nInjected: yes"}),
        ("/a", {"Bad Name": "x"}),
        ("/a", {"Content-Length": "3"}),
    ],
)
def test_a_request_that_cannot_be_framed_safely_is_refused_before_sending(
    serve: type[RawServer], target: str, headers: dict[str, str]
) -> None:
    server = serve([ok(b"")])
    with server.connection() as connection, pytest.raises(ProtocolError):
        connection.request("GET", target, headers)
    assert server.requests == []


# --- response bodies -------------------------------------------------------------
def test_content_length_body(serve: type[RawServer]) -> None:
    server = serve(
        [ok(b'{"kind":"Lease"}', "Content-Type: application/json", "X-Dup: a", "x-dup: b")]
    )
    with server.connection() as connection:
        status, headers, body, will_close = connection.request("GET", "/")
    assert (status, body, will_close) == (200, b'{"kind":"Lease"}', False)
    assert headers["content-type"] == "application/json"
    assert headers["x-dup"] == "a, b"


def test_chunked_body_with_extensions_and_trailers(serve: type[RawServer]) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4;name=value\r\nWiki\r\n"
        b'5 ; quoted="a;b"\r\npedia\r\n'
        b"E\r\n in\r\n\r\nchunks.\r\n"
        b"0;last\r\nExpires: never\r\nX-Trailer: 1\r\n\r\n"
    )
    server = serve([chunked, ok(b"second")])
    with server.connection() as connection:
        first = connection.request("GET", "/one")
        second = connection.request("GET", "/two")  # the trailers were consumed exactly
    assert first.body == b"Wikipedia in\r\n\r\nchunks."
    assert not first.will_close
    assert second.body == b"second"
    assert [index for index, _ in server.requests] == [0, 0]


def test_close_delimited_body_reads_to_the_end_and_closes(serve: type[RawServer]) -> None:
    server = serve([b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it\r\nuntil EOF"])
    connection = server.connection()
    status, _headers, body, will_close = connection.request("GET", "/")
    assert (status, body, will_close) == (200, b"all of it\r\nuntil EOF", True)
    assert connection.sock is None  # closed by the client as well


@pytest.mark.parametrize(
    ("reply", "will_close"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", True),
        (b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Close\r\nContent-Length: 2\r\n\r\nok", True),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", True),  # bytes past the end
    ],
)
def test_will_close_follows_the_connection_header_and_version(
    serve: type[RawServer], reply: bytes, will_close: bool
) -> None:
    server = serve([reply])
    with server.connection() as connection:
        response = connection.request("GET", "/")
    assert (response.body, response.will_close) == (b"ok", will_close)


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n", 304),
    ],
)
def test_204_and_304_have_no_body_and_keep_the_connection(
    serve: type[RawServer], reply: bytes, status: int
) -> None:
    server = serve([reply, ok(b"next")])
    with server.connection() as connection:
        response = connection.request("GET", "/")
        after = connection.request("GET", "/")
    assert (response.status, response.body, response.will_close) == (status, b"", False)
    assert after.body == b"next"


def test_head_has_no_body_whatever_its_content_length(serve: type[RawServer]) -> None:
    server = serve([b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", ok(b"next")])
    with server.connection() as connection:
        head = connection.request("HEAD", "/")
        after = connection.request("GET", "/")
    assert (head.status, head.body, head.headers["content-length"]) == (200, b"", "1234")
    assert after.body == b"next"


def test_interim_1xx_responses_are_skipped(serve: type[RawServer]) -> None:
    server = serve(
        [
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
            + ok(b"final", "X-Final: yes")
        ]
    )
    with server.connection() as connection:
        status, headers, body, _ = connection.request("GET", "/")
    assert (status, body) == (200, b"final")
    assert headers == {"x-final": "yes", "content-length": "5"}


def test_an_endless_run_of_interim_responses_is_refused(serve: type[RawServer]) -> None:
    server = serve([b"HTTP/1.1 100 Continue\r\n\r\n" * (http11.MAX_INTERIM + 1) + ok(b"x")])
    with server.connection() as connection, pytest.raises(ProtocolError, match="interim"):
        connection.request("GET", "/")


# --- keep-alive ------------------------------------------------------------------
def test_one_connection_carries_two_requests(serve: type[RawServer]) -> None:
    server = serve([ok(b"one"), ok(b"two")])
    with server.connection() as connection:
        first = connection.request("GET", "/1")
        sock = connection.sock
        second = connection.request("POST", "/2", {}, b"x")
        assert connection.sock is sock
    assert (first.body, second.body) == (b"one", b"two")
    assert server.accepted == 1
    assert [(index, request.split(b"\r\n")[0]) for index, request in server.requests] == [
        (0, b"GET /1 HTTP/1.1"),
        (0, b"POST /2 HTTP/1.1"),
    ]


def test_kube_client_reuses_its_connection(serve: type[RawServer]) -> None:
    server = serve([lease_reply("a"), lease_reply("b")])
    with server.kube_client() as client:
        assert client.get(LEASE)["spec"]["holderIdentity"] == "a"
        assert client.get(LEASE)["spec"]["holderIdentity"] == "b"
    assert server.accepted == 1
    request = server.requests[0][1]
    assert request.startswith(f"GET {LEASE_PATH} HTTP/1.1\r\n".encode())
    assert b"\r\nAuthorization: Bearer tok\r\n" in request
    assert b"Expect" not in request


def test_an_idle_connection_the_server_closed_is_retried_once_on_a_fresh_one(
    serve: type[RawServer],
) -> None:
    # Connection 0 answers once, then the server closes it while the client holds it idle.
    server = serve([lease_reply("first")], [lease_reply("second")])
    with server.kube_client() as client:
        assert client.get(LEASE)["spec"]["holderIdentity"] == "first"
        assert server.closed[0].wait(5)
        time.sleep(0.05)  # the FIN has reached the client's socket
        assert client.get(LEASE)["spec"]["holderIdentity"] == "second"
    assert server.accepted == 2
    assert [index for index, _ in server.requests] == [0, 1]


def test_a_reused_connection_failing_twice_is_not_retried_again(serve: type[RawServer]) -> None:
    # The retry's fresh connection is closed without an answer as well: Unavailable.
    server = serve([lease_reply("first")], [b""])
    with server.kube_client() as client:
        client.get(LEASE)
        assert server.closed[0].wait(5)
        time.sleep(0.05)
        with pytest.raises(Unavailable, match="closed the connection without answering"):
            client.get(LEASE)
    assert server.accepted == 2


def test_a_fresh_connection_closed_without_an_answer_is_not_retried(
    serve: type[RawServer],
) -> None:
    server = serve([b""], [b""])
    with server.connection() as connection, pytest.raises(ConnectionClosed):
        connection.request("GET", "/")
    with server.kube_client() as client, pytest.raises(Unavailable, match="without answering"):
        client.get(LEASE)
    time.sleep(0.2)  # a retry would have connected by now
    assert server.accepted == 2  # one per attempt above; the kube client did not retry


def test_kube_client_maps_statuses_to_typed_errors(serve: type[RawServer]) -> None:
    status = json.dumps({"kind": "Status", "message": 'leases "cronlock-report" not found'})
    server = serve(
        [b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(status), status.encode())]
    )
    with (
        server.kube_client() as client,
        pytest.raises(NotFound, match='HTTP 404: leases "cronlock-report" not found'),
    ):
        client.get(LEASE)


# --- malformed answers -----------------------------------------------------------
@pytest.mark.parametrize(
    "status_line",
    [
        b"HTTP/1.1 2OO OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/2 200 OK",
        b"HTTP/1.2 200 OK",
        b"ICY 200 OK",
        b"HTTP/1.1  200 OK",
        b"HTTP/1.1 600 Nope",
        b"<html>",
    ],
)
def test_a_malformed_status_line_is_a_protocol_error(
    serve: type[RawServer], status_line: bytes
) -> None:
    server = serve([status_line + b"\r\nContent-Length: 0\r\n\r\n"])
    with (
        server.connection() as connection,
        pytest.raises(ProtocolError, match="malformed status line"),
    ):
        connection.request("GET", "/")


def test_kube_client_reports_a_malformed_answer_as_unavailable(serve: type[RawServer]) -> None:
    server = serve([b"SSH-2.0-OpenSSH_9.6\r\n"])
    with (
        server.kube_client() as client,
        pytest.raises(
            Unavailable,
            match=r"cannot get lease default/cronlock-report: http://127\.0\.0\.1:\d+: "
            r"malformed status line b'SSH-2\.0-OpenSSH_9\.6'",
        ),
    ):
        client.get(LEASE)


def test_a_reason_phrase_is_optional(serve: type[RawServer]) -> None:
    server = serve([b"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx"])
    with server.connection() as connection:
        assert connection.request("GET", "/")[:3] == (200, {"content-length": "1"}, b"x")


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"No colon here", "malformed header line"),
        (b"Content-Length : 2", "malformed header line"),
        (b": empty-name", "malformed header line"),
        (b"X-Folded: a\r\n  continued", "obsolete line folding"),
        (b"X-Ctl: a\x00b", "control character in header X-Ctl"),
    ],
)
def test_a_malformed_header_is_a_protocol_error(
    serve: type[RawServer], header: bytes, message: str
) -> None:
    server = serve([b"HTTP/1.1 200 OK\r\n" + header + b"\r\nContent-Length: 0\r\n\r\n"])
    with server.connection() as connection, pytest.raises(ProtocolError, match=message):
        connection.request("GET", "/")


def test_an_oversized_header_line_is_refused(serve: type[RawServer]) -> None:
    line = b"X-Big: " + b"a" * http11.MAX_LINE
    server = serve([b"HTTP/1.1 200 OK\r\n" + line + b"\r\nContent-Length: 0\r\n\r\n"])
    with (
        server.connection() as connection,
        pytest.raises(ProtocolError, match="header line longer than 16384 bytes"),
    ):
        connection.request("GET", "/")


def test_oversized_headers_in_total_are_refused(serve: type[RawServer]) -> None:
    lines = b"".join(b"X-H%d: %s\r\n" % (n, b"v" * 10_000) for n in range(8))  # 80 KB
    server = serve([b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 0\r\n\r\n"])
    with (
        server.connection() as connection,
        pytest.raises(ProtocolError, match="headers longer than 65536 bytes"),
    ):
        connection.request("GET", "/")


def test_too_many_headers_are_refused(serve: type[RawServer]) -> None:
    lines = b"".join(b"X-H%d: v\r\n" % n for n in range(http11.MAX_HEADERS + 1))
    server = serve([b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 0\r\n\r\n"])
    with (
        server.connection() as connection,
        pytest.raises(ProtocolError, match="more than 100 headers"),
    ):
        connection.request("GET", "/")


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([b"abc"], "invalid Content-Length"),
        ([b"-1"], "invalid Content-Length"),
        ([b"+2"], "invalid Content-Length"),
        ([b"0x2"], "invalid Content-Length"),
        ([b""], "invalid Content-Length"),
        ([b"2, 3"], "conflicting Content-Length"),
        ([b"2", b"3"], "conflicting Content-Length"),
        ([b"99999999999"], "over 16777216"),
    ],
)
def test_a_bad_content_length_is_refused(
    serve: type[RawServer], lengths: list[bytes], message: str
) -> None:
    fields = b"".join(b"Content-Length: " + value + b"\r\n" for value in lengths)
    server = serve([b"HTTP/1.1 200 OK\r\n" + fields + b"\r\nok"])
    with server.connection() as connection, pytest.raises(ProtocolError, match=message):
        connection.request("GET", "/")


def test_repeated_equal_content_lengths_are_accepted(serve: type[RawServer]) -> None:
    server = serve([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2, 2\r\n\r\nok"])
    with server.connection() as connection:
        assert connection.request("GET", "/").body == b"ok"


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokX\r\n0\r\n\r\n", "CRLF"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "unsupported Transfer"),
    ],
)
def test_bad_chunked_framing_is_refused(serve: type[RawServer], reply: bytes, message: str) -> None:
    server = serve([reply])
    with server.connection() as connection, pytest.raises(ProtocolError, match=message):
        connection.request("GET", "/")


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            "closed after 3 of 10 bytes of the body",
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "closed after 2 of 5"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", "chunk size line"),
        (b"HTTP/1.1 200 OK\r\nContent-Len", "closed in the middle of the header line"),
        (b"HTTP/1.1 200 OK\r\n", "closed in the headers"),
        (b"HTTP/1.1 2", "closed in the middle of the status line"),
    ],
)
def test_a_truncated_answer_is_refused(serve: type[RawServer], reply: bytes, message: str) -> None:
    server = serve([reply])
    with server.connection() as connection, pytest.raises(ProtocolError, match=message):
        connection.request("GET", "/")
    assert connection.sock is None


def test_bodies_over_the_cap_are_refused(
    serve: type[RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http11, "MAX_BODY", 8)
    server = serve(
        [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\n12345\r\n5\r\n67890\r\n0\r\n\r\n"
        ],
        [b"HTTP/1.1 200 OK\r\n\r\n123456789"],
        [b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n123456789"],
        [b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n12345678"],
    )
    for _ in range(3):
        with server.connection() as connection, pytest.raises(ProtocolError, match="over 8"):
            connection.request("GET", "/")
    with server.connection() as connection:
        assert connection.request("GET", "/").body == b"12345678"


# --- timeouts --------------------------------------------------------------------
def test_a_silent_server_times_out(serve: type[RawServer]) -> None:
    server = serve([Stall()])
    started = time.monotonic()
    with (
        server.connection(timeout=0.3) as connection,
        pytest.raises(TimeoutError, match="timed out"),
    ):
        connection.request("GET", "/")
    assert 0.25 < time.monotonic() - started < 3


def test_a_server_dripping_bytes_cannot_stretch_the_request_past_its_timeout(
    serve: type[RawServer],
) -> None:
    # Each byte comes well within the timeout; the request as a whole still ends in time.
    server = serve([Stall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100, 0.05)])
    started = time.monotonic()
    with server.connection(timeout=0.5) as connection, pytest.raises(TimeoutError):
        connection.request("GET", "/")
    assert 0.45 < time.monotonic() - started < 2


def test_kube_client_reports_a_timeout_as_unavailable(serve: type[RawServer]) -> None:
    server = serve([Stall(b"HTTP/1.1 200 OK\r\n")])
    with (
        server.kube_client(timeout=0.3) as client,
        pytest.raises(
            Unavailable, match=r"get lease default/cronlock-report: http://[^ ]+: timed out$"
        ),
    ):
        client.get(LEASE)


# --- against the fake API server (http.server) and at import ---------------------
def test_create_get_replace_against_the_fake_api_server(api_server: FakeApiServer) -> None:
    cluster = Cluster(server=api_server.url, ssl_context=None, token="fake-token")  # noqa: S106
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE.name},
    }
    with KubeLeaseClient(cluster) as client:
        created = client.create(LEASE, body)
        created["spec"] = {"holderIdentity": "me"}
        client.replace(LEASE, created)
        assert client.get(LEASE)["spec"] == {"holderIdentity": "me"}
    assert api_server.requests == [
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases"),
        ("PUT", LEASE_PATH),
        ("GET", LEASE_PATH),
    ]


def test_the_run_path_never_imports_http_client_or_email() -> None:
    code = (
        "import sys\n"
        "import cronlock_sidecar.cli, cronlock_sidecar.commands.run\n"
        "import cronlock_sidecar.transport.kubeapi\n"
        "print(sorted(name for name in sys.modules\n"
        "             if name == 'http.client' or name.split('.')[0] == 'email'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
