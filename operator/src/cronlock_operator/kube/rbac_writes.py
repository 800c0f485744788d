"""Writing the holder Roles and RoleBindings that `rbac.decide` asked for, and no others."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kubernetes

from cronlock_operator.errors import NotOurs
from cronlock_operator.kube.answers import done, raw, transient_errors
from cronlock_operator.lock.ownership import made_by_cronlock
from cronlock_sidecar import contract


class HolderRbacWrites:
    """Part of `Kube`: the holder RBAC of a namespace, through its RBAC client."""

    rbac: kubernetes.client.RbacAuthorizationV1Api

    def write_holder_rbac(
        self,
        namespace: str,
        roles: Sequence[dict[str, Any]],
        bindings: Sequence[dict[str, Any]],
    ) -> None:
        """Exactly these holder Roles and RoleBindings: each written if it differs, and the
        labelled ones no guarded CronJob needs any more deleted.

        A Role or RoleBinding of the same name that cronlock did not make is left alone;
        the others are written all the same, then NotOurs names the ones left alone.
        """
        conflicts: dict[str, str] = {}
        with transient_errors(f"sync rbac in {namespace}"):
            for role, binding in zip(roles, bindings, strict=True):
                try:
                    self._upsert(
                        self.rbac.read_namespaced_role,
                        self.rbac.create_namespaced_role,
                        self.rbac.replace_namespaced_role,
                        namespace,
                        role,
                        ("rules",),
                    )
                    self._upsert(
                        self.rbac.read_namespaced_role_binding,
                        self.rbac.create_namespaced_role_binding,
                        self.rbac.replace_namespaced_role_binding,
                        namespace,
                        binding,
                        ("subjects", "roleRef"),
                    )
                except NotOurs as conflict:
                    conflicts[role["metadata"]["name"]] = str(conflict)
            wanted = {item["metadata"]["name"] for item in (*roles, *bindings)}
            selector = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
            for listing, delete in (
                (self.rbac.list_namespaced_role_binding, self.rbac.delete_namespaced_role_binding),
                (self.rbac.list_namespaced_role, self.rbac.delete_namespaced_role),
            ):
                for item in listing(namespace, label_selector=selector).items:
                    stale = item.metadata.name
                    if stale.startswith(contract.HOLDER_ROLE) and stale not in wanted:
                        try:
                            delete(stale, namespace)
                        except kubernetes.client.ApiException as error:
                            if error.status != 404:
                                raise
        if conflicts:
            raise NotOurs("; ".join(conflicts.values()), conflicts)

    def _upsert(
        self,
        read: Any,
        create: Any,
        replace: Any,
        namespace: str,
        desired: dict[str, Any],
        fields: tuple[str, ...],
    ) -> bool:
        name = desired["metadata"]["name"]
        try:
            current = raw(read(name, namespace, _preload_content=False))
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
            done(create(namespace, desired, _preload_content=False))
            return True
        if not made_by_cronlock(current):
            kind = "RoleBinding" if "roleRef" in desired else "Role"
            raise NotOurs(
                f"{kind} {namespace}/{name} exists and was not made by cronlock (it lacks the "
                f"label {contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}); cronlock leaves it "
                "as it is, so runs of this ServiceAccount get no holder access: rename or "
                f"delete that {kind}, or give the CronJob another serviceAccountName"
            )
        if all(current.get(key) == desired[key] for key in fields) and (
            (current["metadata"].get("labels") or {}).items()
            >= desired["metadata"]["labels"].items()
        ):
            return False
        desired = {
            **desired,
            "metadata": {
                **desired["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        done(replace(name, namespace, desired, _preload_content=False))
        return True
