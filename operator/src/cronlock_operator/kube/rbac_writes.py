"""The holder Roles and RoleBindings on the API server: read, create, replace, list, delete.

Which of them to write, and whether one of the same name is cronlock's to write at all,
is decided by `reconcile.rbac`; this only sends it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import kubernetes

from cronlock_operator.kube.answers import answered, done, found
from cronlock_operator.kube.client import FIELD_MANAGER
from cronlock_operator.kube.errors import NotFound
from cronlock_operator.reconcile.rbac import RbacKind
from cronlock_sidecar import contract


class HolderRbac:
    """Role and RoleBinding calls of one RBAC client, with the same errors as `Kube`'s."""

    def __init__(self, api: kubernetes.client.RbacAuthorizationV1Api) -> None:
        self.api = api

    def _call(self, verb: str, kind: RbacKind) -> Any:
        """The client's method for `verb` on `kind`: `read_namespaced_role`, ..."""
        suffix = "role" if kind == "Role" else "role_binding"
        return getattr(self.api, f"{verb}_namespaced_{suffix}")

    def read(self, kind: RbacKind, namespace: str, name: str) -> dict[str, Any] | None:
        call = self._call("read", kind)
        return found(
            f"get {kind} {namespace}/{name}", lambda: call(name, namespace, _preload_content=False)
        )

    def create(self, kind: RbacKind, namespace: str, body: dict[str, Any]) -> None:
        call = self._call("create", kind)
        with answered(f"create {kind} {namespace}/{body['metadata']['name']}"):
            done(call(namespace, body, field_manager=FIELD_MANAGER, _preload_content=False))

    def replace(self, kind: RbacKind, namespace: str, body: dict[str, Any]) -> None:
        """Replace it (the body carries the resourceVersion it was read at)."""
        call = self._call("replace", kind)
        name = body["metadata"]["name"]
        with answered(f"replace {kind} {namespace}/{name}"):
            done(call(name, namespace, body, field_manager=FIELD_MANAGER, _preload_content=False))

    def labelled(self, kind: RbacKind, namespace: str) -> list[str]:
        """The names of the namespace's Roles (or RoleBindings) labelled as cronlock's."""
        call = self._call("list", kind)
        selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
        with answered(f"list {kind}s in {namespace}"):
            return [item.metadata.name for item in call(namespace, label_selector=selector).items]

    def delete(self, kind: RbacKind, namespace: str, name: str) -> None:
        """Delete it; one already gone is fine."""
        call = self._call("delete", kind)
        with contextlib.suppress(NotFound), answered(f"delete {kind} {namespace}/{name}"):
            done(call(name, namespace, _preload_content=False))
