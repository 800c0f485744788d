"""How the operator reads the API server's answers: hiccups, refusals, unread bodies.

`transient_errors` turns what a retry can fix into `Retry` for the work queue, and a 404
no inner handler expected into `Gone` (the object or its namespace was deleted);
`invalid_message` and `policy_denial` find the refusals no retry can change (`Rejected`);
`raw` and `done` finish each response so its connection goes back to the pool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kubernetes
import urllib3

from cronlock_operator.kube.errors import Gone, Retry

_RETRIABLE = {409, 422, 429, 500, 502, 503, 504}


@contextmanager
def transient_errors(what: str) -> Iterator[None]:
    """Turn API hiccups into Retry so the work queue backs off and tries again, and a
    404 into Gone: past this edge nothing needs the client's exceptions."""
    try:
        yield
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            raise Gone(f"{what}: {error.reason}") from error
        if error.status in _RETRIABLE or error.status == 403:
            # 403 too: the RBAC that is missing now may be granted in a moment.
            raise Retry(f"{what}: HTTP {error.status} {error.reason}") from error
        raise
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise Retry(f"{what}: {error}") from error


def invalid_message(error: Any) -> str:
    """The API server's message for a 422 that names what is invalid; "" for a bare one."""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError):
        return ""
    if not isinstance(status, dict) or not (status.get("details") or {}).get("causes"):
        return ""
    return str(status.get("message") or "")


def policy_denial(error: Any) -> str:
    """The message of a 403 from an admission policy ("" for any other answer): a refusal
    that no retry can change, unlike RBAC that may be granted in a moment."""
    if getattr(error, "status", None) != 403:
        return ""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError):
        return ""
    message = str(status.get("message") or "") if isinstance(status, dict) else ""
    return message if "ValidatingAdmissionPolicy" in message else ""


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
