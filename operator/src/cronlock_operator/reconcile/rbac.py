"""The RBAC reconciler: which holder Roles and RoleBindings a namespace needs, decided purely.

A run's pod may get, update and patch only the Leases of the CronJobs that run as its
ServiceAccount: one Role and RoleBinding per account, `resourceNames` restricted to
those Leases, no create and no delete.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cronlock_operator.reconcile.actions import Action, WriteHolderRbac
from cronlock_sidecar import contract

MAX_NAME = 253


@dataclass(frozen=True)
class Guard:
    """A guarded CronJob as RBAC sees it: which Lease its pods hold, as which account."""

    lease: str
    service_account: str


def holder_role_name(service_account: str) -> str:
    """`cronlock-holder-<account>`, shortened with a hash where it would be too long."""
    name = f"{contract.HOLDER_ROLE}-{service_account}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(service_account.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11]}-{digest}"


def decide(
    namespace: str, guards: Iterable[Guard], synced: frozenset[Guard] | None
) -> tuple[frozenset[Guard], list[Action]]:
    """The guards the Roles must grant, and the write that makes them so (none if in sync)."""
    desired = frozenset(guards)
    if synced == desired:
        return desired, []
    leases_by_account: dict[str, set[str]] = {}
    for guard in desired:
        leases_by_account.setdefault(guard.service_account, set()).add(guard.lease)
    accounts = sorted(leases_by_account.items())
    return desired, [
        WriteHolderRbac(
            namespace,
            tuple(holder_role(account, sorted(leases)) for account, leases in accounts),
            tuple(holder_binding(namespace, account) for account, _ in accounts),
        )
    ]


def holder_role(service_account: str, lease_names: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": holder_role_name(service_account), "labels": _labels()},
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": lease_names,
                "verbs": ["get", "update", "patch"],
            }
        ],
    }


def holder_binding(namespace: str, service_account: str) -> dict[str, Any]:
    name = holder_role_name(service_account)
    return {
        "metadata": {"name": name, "labels": _labels()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }


def _labels() -> dict[str, str]:
    return {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
