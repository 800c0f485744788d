"""How the operator reads the API server's answers: its errors, and its unread bodies.

`api_error` is the one reader of the client's exceptions (`kubernetes.client.ApiException`,
urllib3's and the socket's errors): it turns each into the tree of `kube/errors.py`, whose
`error_of` picks the class by status. `answered` does that around a call, so past it
nothing needs the client's exceptions; every module that talks to the API server (kube/,
status, freeze, storeaccess, selfcheck, uninstall) catches through it. `raw` and `done`
finish each response so its connection goes back to the pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import kubernetes
import urllib3

from cronlock_operator.kube.errors import APIError, NotFound, error_of

# What a request raises when the API server did not answer: the connection's errors.
NO_ANSWER = (urllib3.exceptions.HTTPError, OSError)


@contextmanager
def answered(what: str) -> Iterator[None]:
    """Around a request (`what`, as "get lease team-a/cronlock-report"): its failures as
    the tree's errors, the client's chained as the cause."""
    try:
        yield
    except (kubernetes.client.ApiException, *NO_ANSWER) as error:
        raise api_error(what, error) from error


def found(what: str, read: Callable[[], Any]) -> dict[str, Any] | None:
    """One object as the API server sent it (`read` asks with `_preload_content=False`);
    None when there is none (404)."""
    try:
        with answered(what):
            return raw(read())
    except NotFound:
        return None


def api_error(what: str, error: BaseException) -> APIError:
    """The tree's error for what a request `what` raised: the API server's answer by its
    status; anything else (the connection's errors, a body that is no API server's) is no
    answer, status 0."""
    if isinstance(error, kubernetes.client.ApiException):
        status = int(error.status or 0)
        message, causes = _status_of(error.body)
        reason = str(error.reason or "")
        return error_of(
            status,
            f"{what}: HTTP {status} {reason}",
            reason=reason,
            message=message,
            causes=causes,
        )
    if isinstance(error, urllib3.exceptions.MaxRetryError) and error.reason is not None:
        # urllib3 wraps the connection's own error in the URL and retry count.
        error = error.reason
    return error_of(0, f"{what}: {error}", reason=str(error))


def _status_of(body: Any) -> tuple[str, int]:
    """The message of a Status body and how many causes it names ("", 0 when none)."""
    try:
        status = json.loads(body or "")
    except (TypeError, ValueError):
        return "", 0
    if not isinstance(status, dict):
        return "", 0
    causes = (status.get("details") or {}).get("causes") or []
    return str(status.get("message") or ""), len(causes) if isinstance(causes, list) else 0


def raw(response: Any) -> dict[str, Any]:
    """The object exactly as the API server sent it (the client's models reformat times)."""
    data = response.data
    response.release_conn()
    result: dict[str, Any] = json.loads(data)
    return result


def done(response: Any) -> None:
    """Finish a response whose body nobody needs, so its connection goes back to the pool.

    With `_preload_content=False` the client leaves the body unread, and urllib3 keeps an
    unread connection out of the pool: every write then opened a new TLS connection, and
    the handshakes dominated the operator's CPU while injecting (docs/PERFORMANCE.md).
    """
    response.drain_conn()
    response.release_conn()
