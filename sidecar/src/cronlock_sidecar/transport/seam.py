"""What the lease state machine needs from the API server, so it can be tested with fakes."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

Lease = dict[str, Any]


class LeaseRef(NamedTuple):
    """Where a Lease lives: `namespace/name`, as users write it."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ApiError(Exception):
    """A request about a Lease that the API server did not carry out."""

    reason = "error"

    def __init__(self, verb: str, lease: LeaseRef, detail: str) -> None:
        super().__init__(f"{self.reason}: cannot {verb} lease {lease}: {detail}")
        self.verb = verb
        self.lease = lease
        self.detail = detail


class NotFound(ApiError):
    """The Lease does not exist (404)."""

    reason = "not found"


class Conflict(ApiError):
    """Someone else wrote the Lease first (409): re-read and decide again."""

    reason = "conflict"


class Forbidden(ApiError):
    """RBAC or authentication refused the request (401, 403): fail closed."""

    reason = "forbidden"


class Unavailable(ApiError):
    """The API server could not be reached or answered with an error: fail closed."""

    reason = "unavailable"


class LeaseTransport(Protocol):
    """Get, create and replace one Lease as plain dicts; errors are the classes above."""

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease: ...

    def create(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease: ...

    def replace(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease: ...


class StoreClient(LeaseTransport, Protocol):
    """A store's client: a LeaseTransport its user closes when it is done."""

    def close(self) -> None: ...
