"""What the runtime asks of the API server, as Protocols: `Kube` and `HolderRbac` are the
real ones; the tests' in-memory fake (`tests/support/fakekube.py`) is the other. The
runtime is typed against these, so a fake that drifts from the real calls fails mypy's
and the tests' check (`tests/unit/operator/test_fakekube.py`), not a test's meaning."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.reconcile.rbac import RbacKind


@runtime_checkable
class HolderRbacCalls(Protocol):
    def read(self, kind: RbacKind, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create(self, kind: RbacKind, namespace: str, body: dict[str, Any]) -> None: ...

    def replace(self, kind: RbacKind, namespace: str, body: dict[str, Any]) -> None: ...

    def labelled(self, kind: RbacKind, namespace: str) -> list[str]: ...

    def delete(self, kind: RbacKind, namespace: str, name: str) -> None: ...


@runtime_checkable
class KubeCalls(Protocol):
    @property
    def holder_rbac(self) -> HolderRbacCalls: ...

    def patch_cronjob(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any] | None: ...

    def annotate_cronjob(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None: ...

    def list_cronjobs(self, namespaces: Sequence[str], into: ObjectCache) -> None: ...

    def list_leases(self, namespaces: Sequence[str]) -> Iterator[dict[str, Any]]: ...

    def labelled_namespaces(self) -> list[str]: ...

    def read_cronjob(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_lease(
        self, namespace: str, body: Mapping[str, Any]
    ) -> tuple[dict[str, Any], bool]: ...

    def merge_lease(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def patch_lease(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> bool: ...

    def delete_lease(self, namespace: str, name: str, version: str) -> None: ...

    def mark_job(
        self, namespace: str, name: str, annotation: str, value: str, *, outcome: str | None = None
    ) -> bool: ...

    def resume_job(self, namespace: str, name: str) -> bool: ...

    def delete_job(self, namespace: str, name: str, version: str | None = None) -> bool: ...

    def post_event(
        self,
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None: ...
