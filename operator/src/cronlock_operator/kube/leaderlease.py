"""The leader election's Lease at the Kubernetes edge: read, create and replace it, with
the client's answers turned into values (None when there is none, False when another
replica wrote first) and its failures into the tree of `kube/errors.py` (`APIError`), so
runtime/leader.py, which decides who leads, needs no client (the operator's "only kube/
imports kubernetes" contract)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import kubernetes

from cronlock_operator.kube.answers import answered, found
from cronlock_operator.kube.client import FIELD_MANAGER
from cronlock_operator.kube.errors import Conflict


class LeaderLeaseCalls(Protocol):
    """What the election does to its one Lease."""

    def read(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create(self, namespace: str, body: dict[str, Any]) -> bool: ...

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool: ...


class LeaderLeases:
    """LeaderLeaseCalls on the API server, through the client's CoordinationV1Api."""

    def __init__(self, api: kubernetes.client.ApiClient | None = None, leases: Any = None):
        self.leases = leases or kubernetes.client.CoordinationV1Api(api)

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease as the API server sent it; None when there is none (404)."""
        return found(
            f"read lease {namespace}/{name}",
            lambda: self.leases.read_namespaced_lease(name, namespace, _preload_content=False),
        )

    def create(self, namespace: str, body: dict[str, Any]) -> bool:
        """True once created; False when it exists already (409: another replica)."""
        return _written(
            f"create lease {namespace}",
            lambda: self.leases.create_namespaced_lease(
                namespace, body, field_manager=FIELD_MANAGER, _preload_content=False
            ),
        )

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        """True once written; False when the Lease changed since `body` was read (409)."""
        return _written(
            f"replace lease {namespace}/{name}",
            lambda: self.leases.replace_namespaced_lease(
                name, namespace, body, field_manager=FIELD_MANAGER, _preload_content=False
            ),
        )


def _written(what: str, write: Callable[[], Any]) -> bool:
    """One write: False on a 409 (another replica wrote first); any other failure of the
    API or the connection is an `APIError` (the election tries again at its next renewal,
    and a leader that cannot write gives up at its renew deadline)."""
    try:
        with answered(what):
            write().release_conn()
    except Conflict:
        return False
    return True
