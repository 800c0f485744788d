"""A small HTTP/1.1 client connection on socket + ssl.

The sidecar is a short-lived process, and importing `http.client` (with its `email`
parser) was a fifth of a short run (docs/PERFORMANCE.md). This is the part of HTTP/1.1
that talking to kube-apiserver needs: one request at a time on one kept-alive connection, responses
framed by Content-Length, chunked transfer coding or the connection's end.

Every socket operation of a request (connect, TLS handshake, send, each receive) is
bounded by what is left of the request's timeout, so a whole request never takes longer
than that; running out raises `TimeoutError` (`socket.timeout`, "timed out"). Name
resolution (getaddrinfo) is not bounded, as with `http.client`.
"""

from __future__ import annotations

import base64
import socket
import ssl
import time
from typing import NamedTuple
from urllib.parse import SplitResult, unquote, urlsplit

MAX_LINE = 16 * 1024  # one status, header, chunk-size or trailer line
MAX_HEADER_BYTES = 64 * 1024  # all header lines of one response (or its trailers)
MAX_HEADERS = 100
MAX_BODY = 16 * 1024 * 1024
MAX_INTERIM = 16  # 1xx responses skipped before the final one
_RECV = 64 * 1024
# RFC 9110 token characters, for header field names.
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_HEX = frozenset(b"0123456789abcdefABCDEF")


class ProtocolError(Exception):
    """The server's answer is not acceptable HTTP/1.1 (or the request could not be framed)."""


class ConnectionClosed(ConnectionResetError):
    """The server closed the connection before sending any byte of a response.

    On a kept-alive connection this is what an idle timeout on the server side looks
    like; the request can be retried on a fresh connection.
    """


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    body: bytes
    will_close: bool  # the connection cannot carry another request


def proxy_address(proxy: SplitResult) -> str:
    """scheme://host:port of a proxy URL, for messages: never its user:password@."""
    host = proxy.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = proxy.port
    except ValueError:
        port = None
    return f"{proxy.scheme}://{host}" + (f":{port}" if port else "")


class Connection:
    """One HTTP/1.1 connection (TCP, then TLS when `ssl_context` is given)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = 5.0,
        server_hostname: str = "",
        proxy: str = "",
    ) -> None:
        self.host = host
        self.port = port
        # http://[user:password@]host:port of an HTTP proxy to tunnel through (CONNECT).
        self.proxy = proxy
        self.ssl_context = ssl_context
        # The name the certificate is checked against (kubeconfig tls-server-name), if not host.
        self.server_hostname = server_hostname or host
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self._buffer = bytearray()
        self._eof = False
        self._deadline = 0.0
        default_port = 443 if ssl_context is not None else 80
        name = host if host.isascii() else host.encode("idna").decode("ascii")
        if ":" in name:
            name = f"[{name}]"
        self.host_header = name if port == default_port else f"{name}:{port}"

    # --- connection ----------------------------------------------------------------
    def connect(self) -> None:
        """Open the TCP connection and, for HTTPS, do the TLS handshake, within `timeout`."""
        self._deadline = time.monotonic() + self.timeout
        self._connect()

    def _connect(self) -> None:
        self.close()
        if self.proxy:
            sock = self._tunnel()
        else:
            sock = socket.create_connection((self.host, self.port), timeout=self._remaining())
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                sock.settimeout(self._remaining())
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.server_hostname)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def _tunnel(self) -> socket.socket:
        """A TCP connection to host:port through the proxy's CONNECT (as kubectl's)."""
        # The proxy's text may hold a password: messages name only its scheme, host and port.
        malformed = ProtocolError("proxy: not a URL of the form http://host:port")
        try:
            proxy = urlsplit(self.proxy)
            proxy_port = proxy.port or 80
        except ValueError:
            raise malformed from None
        if not proxy.hostname:
            raise malformed
        if proxy.scheme != "http":
            raise ProtocolError(f"proxy {proxy_address(proxy)}: only http:// proxies are supported")
        sock = socket.create_connection((proxy.hostname, proxy_port), timeout=self._remaining())
        try:
            name = f"[{self.host}]" if ":" in self.host else self.host
            target = f"{name}:{self.port}"
            head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
            if proxy.username:
                secret = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
                head += (
                    f"Proxy-Authorization: Basic {base64.b64encode(secret.encode()).decode()}\r\n"
                )
            sock.sendall((head + "\r\n").encode("latin-1"))
            answer = b""
            while b"\r\n\r\n" not in answer:
                sock.settimeout(self._remaining())
                chunk = sock.recv(4096)
                if not chunk or len(answer) > 16384:
                    raise ProtocolError(f"proxy {proxy.hostname}: no answer to CONNECT")
                answer += chunk
            status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[1].startswith("2"):
                raise ProtocolError(
                    f"proxy {proxy.hostname} refused CONNECT {target}: {status_line}"
                )
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        sock, self.sock = self.sock, None
        self._buffer.clear()
        self._eof = False
        if sock is not None:
            sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- one exchange --------------------------------------------------------------
    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> Response:
        """Send one request and read its whole response; connects first if needed.

        On any error the connection is closed and the error raised: `TimeoutError`,
        `ConnectionClosed` (no answer at all: retry on a fresh connection if this one
        was kept alive), other `OSError`s, or `ProtocolError` for a malformed answer.
        """
        self._deadline = time.monotonic() + self.timeout
        head = _request_head(method, target, self.host_header, headers or {}, body)
        try:
            if self.sock is None:
                self._connect()
            self._send(head + body if body else head)
            response = self._read_response(method)
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        return response

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left

    def _send(self, data: bytes) -> None:
        sock = self._socket()
        sock.settimeout(self._remaining())
        try:
            sock.sendall(data)
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as error:
            raise ConnectionClosed(f"the server closed the connection: {error}") from error

    def _socket(self) -> socket.socket:
        if self.sock is None:
            raise ProtocolError("the connection is closed")
        return self.sock

    # --- reading -------------------------------------------------------------------
    def _fill(self) -> bool:
        """Receive more bytes into the buffer; False at the end of the stream."""
        if self._eof:
            return False
        sock = self._socket()
        sock.settimeout(self._remaining())
        data = sock.recv(_RECV)
        if not data:
            self._eof = True
            return False
        self._buffer += data
        return True

    def _line(self, what: str, limit: int = MAX_LINE) -> bytes | None:
        """One line without its CRLF (a bare LF is accepted); None at a clean end of stream."""
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end >= 0:
                if end > limit:
                    raise ProtocolError(f"{what} longer than {limit} bytes")
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return line[:-1] if line.endswith(b"\r") else line
            if len(self._buffer) > limit:
                raise ProtocolError(f"{what} longer than {limit} bytes")
            start = len(self._buffer)
            if not self._fill():
                if self._buffer:
                    raise ProtocolError(f"the connection closed in the middle of the {what}")
                return None

    def _exactly(self, size: int, what: str) -> bytes:
        while len(self._buffer) < size:
            if not self._fill():
                raise ProtocolError(
                    f"the connection closed after {len(self._buffer)} of {size} bytes of the {what}"
                )
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def _read_response(self, method: str) -> Response:
        for interim in range(MAX_INTERIM + 1):
            try:
                status_line = self._line("status line")
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as error:
                if self._buffer or interim:
                    raise
                raise ConnectionClosed(f"the server closed the connection: {error}") from error
            if status_line is None:
                if interim:
                    raise ProtocolError("the connection closed after an interim (1xx) response")
                raise ConnectionClosed("the server closed the connection without answering")
            minor, status = _parse_status_line(status_line)
            headers = self._headers("header")
            if status == 101:
                raise ProtocolError("unexpected 101 Switching Protocols (no upgrade was asked for)")
            if status >= 200:
                break
        else:
            raise ProtocolError(f"more than {MAX_INTERIM} interim (1xx) responses")
        connection = {token.strip().lower() for token in headers.get("connection", "").split(",")}
        will_close = "close" in connection or (minor == 0 and "keep-alive" not in connection)
        if method == "HEAD" or status in {204, 304}:
            body = b""
        elif "transfer-encoding" in headers:
            codings = [coding.strip().lower() for coding in headers["transfer-encoding"].split(",")]
            if codings != ["chunked"]:
                raise ProtocolError(
                    f"unsupported Transfer-Encoding {headers['transfer-encoding']!r}"
                )
            body = self._chunked()
            # A message with both is suspect (RFC 9112 6.3): chunked wins, and the
            # connection is not reused.
            will_close = will_close or "content-length" in headers or minor == 0
        elif "content-length" in headers:
            length = _content_length(headers["content-length"])
            if length > MAX_BODY:
                raise ProtocolError(f"response body of {length} bytes is over {MAX_BODY}")
            body = self._exactly(length, "body")
        else:
            body = self._to_end()
            will_close = True
        if self._buffer:
            # Bytes after the end of the response: the framing cannot be trusted further.
            will_close = True
        return Response(status, headers, body, will_close)

    def _headers(self, what: str) -> dict[str, str]:
        """Header (or trailer) lines up to the empty line."""
        fields: dict[str, str] = {}
        total = 0
        count = 0
        while True:
            line = self._line(f"{what} line")
            if line is None:
                raise ProtocolError(f"the connection closed in the {what}s")
            if not line:
                return fields
            total += len(line) + 2
            count += 1
            if total > MAX_HEADER_BYTES:
                raise ProtocolError(f"{what}s longer than {MAX_HEADER_BYTES} bytes")
            if count > MAX_HEADERS:
                raise ProtocolError(f"more than {MAX_HEADERS} {what}s")
            name, value = _parse_field(line, what)
            fields[name] = f"{fields[name]}, {value}" if name in fields else value

    def _chunked(self) -> bytes:
        body = bytearray()
        while True:
            line = self._line("chunk size line")
            if line is None:
                raise ProtocolError("the connection closed before the chunk size line")
            size = _chunk_size(line)
            if size == 0:
                self._headers("trailer")
                return bytes(body)
            if len(body) + size > MAX_BODY:
                raise ProtocolError(f"chunked response body is over {MAX_BODY} bytes")
            body += self._exactly(size, "chunk")
            if self._exactly(2, "chunk") != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")

    def _to_end(self) -> bytes:
        while True:
            if len(self._buffer) > MAX_BODY:
                raise ProtocolError(f"response body is over {MAX_BODY} bytes")
            if not self._fill():
                break
        body = bytes(self._buffer)
        self._buffer.clear()
        return body


def _request_head(
    method: str, target: str, host: str, headers: dict[str, str], body: bytes | None
) -> bytes:
    if not method or not all(byte in _TCHAR for byte in method.encode("latin-1", "replace")):
        raise ProtocolError(f"invalid request method {method!r}")
    if (
        not target
        or not target.isascii()
        or any(ord(char) <= 0x20 or char == "\x7f" for char in target)
    ):
        raise ProtocolError(f"invalid request target {target!r}")
    lines = [f"{method} {target} HTTP/1.1"]
    names = {name.lower() for name in headers}
    if "host" not in names:
        lines.append(f"Host: {host}")
    if "content-length" in names or "transfer-encoding" in names:
        raise ProtocolError("the request body is framed by the client itself")
    for name, value in headers.items():
        if not name or not all(byte in _TCHAR for byte in name.encode("latin-1", "replace")):
            raise ProtocolError(f"invalid request header name {name!r}")
        if any(char in value for char in "\r\n\0"):
            raise ProtocolError(f"invalid value for request header {name}")
        lines.append(f"{name}: {value}")
    if body is not None or method in {"POST", "PUT", "PATCH"}:
        lines.append(f"Content-Length: {len(body or b'')}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as error:
        raise ProtocolError(f"request header not encodable as Latin-1: {error}") from error


def _parse_status_line(line: bytes) -> tuple[int, int]:
    """(minor version, status) of `HTTP/1.x NNN reason`."""
    version, _, rest = line.partition(b" ")
    code, _, _reason = rest.partition(b" ")
    if (
        len(version) != 8
        or not version.startswith(b"HTTP/1.")
        or version[7:] not in (b"0", b"1")
        or len(code) != 3
        or not code.isdigit()
        or not 100 <= int(code) <= 599
    ):
        raise ProtocolError(f"malformed status line {line[:100]!r}")
    return int(version[7:]), int(code)


def _parse_field(line: bytes, what: str) -> tuple[str, str]:
    if line[:1] in (b" ", b"\t"):
        raise ProtocolError(f"obsolete line folding in the {what}s: {line[:100]!r}")
    name, colon, value = line.partition(b":")
    if not colon or not name or not all(byte in _TCHAR for byte in name):
        raise ProtocolError(f"malformed {what} line {line[:100]!r}")
    value = value.strip(b" \t")
    if any((byte < 0x20 and byte != 0x09) or byte == 0x7F for byte in value):
        raise ProtocolError(f"control character in {what} {name.decode('ascii')}")
    return name.decode("ascii").lower(), value.decode("latin-1")


def _content_length(value: str) -> int:
    # Repeated fields (or a list) are allowed only when every value is the same.
    values = {part.strip(" \t") for part in value.split(",")}
    if len(values) != 1:
        raise ProtocolError(f"conflicting Content-Length values {value!r}")
    (digits,) = values
    if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > 18:
        raise ProtocolError(f"invalid Content-Length {value!r}")
    return int(digits)


def _chunk_size(line: bytes) -> int:
    size, _, _extensions = line.partition(b";")
    size = size.rstrip(b" \t")
    if not size or len(size) > 16 or not all(byte in _HEX for byte in size):
        raise ProtocolError(f"malformed chunk size line {line[:100]!r}")
    return int(size, 16)
