"""The RBAC reconciler: which holder Roles and RoleBindings a namespace needs, decided purely.

A run's pod may get, update and patch only the Leases of the CronJobs that run as its
ServiceAccount: one Role and RoleBinding per account, `resourceNames` restricted to
those Leases, no create and no delete. `write_for` judges, from what the API server has
under a holder Role's name, what to write there (nothing, when it is not cronlock's).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

from cronlock_operator.leases.ownership import made_by_cronlock
from cronlock_operator.reconcile.actions import Action, WriteHolderRbac
from cronlock_sidecar import contract

MAX_NAME = 253
RbacKind = Literal["Role", "RoleBinding"]


@dataclass(frozen=True)
class Guard:
    """A guarded CronJob as RBAC sees it: which Lease its pods hold, as which account.

    A lock kept in Redis or PostgreSQL has a Lease too, as its registry (who uses it, with
    whose consent), but its pods never write it: `holds` False, and no Role grants it."""

    lease: str
    service_account: str
    holds: bool = True


@dataclass(frozen=True)
class HolderGrants:
    """What one namespace's holder Roles grant, as the holder RBAC reconciler last wrote
    them: an input of each CronJob decision there (a CronJob's run may start only once its
    account's Role grants its Lease).

    `granted`: the guards the Roles are in line with; `written`: the guards of the last
    write, made where it could be (a Role that is not cronlock's is left alone, the others
    written all the same); `conflicts`: holder Role name -> why cronlock could not write it."""

    granted: frozenset[Guard] = frozenset()
    written: frozenset[Guard] = frozenset()
    conflicts: Mapping[str, str] = field(default_factory=dict)

    def conflict(self, service_account: str) -> str | None:
        """Why the holder Role of this ServiceAccount could not be written, if it could not."""
        return self.conflicts.get(holder_role_name(service_account))


class GrantView(Protocol):
    """The holder RBAC reconciler's grants, read only (its reconciler alone writes them)."""

    def grants(self, namespace: str) -> HolderGrants: ...


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
        if guard.holds:
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


# What of each kind is cronlock's to keep as desired.
_FIELDS: dict[str, tuple[str, ...]] = {"Role": ("rules",), "RoleBinding": ("subjects", "roleRef")}


class RbacWrite(NamedTuple):
    """What to do under one holder Role's (or RoleBinding's) name: `create` it, leave it
    (`same`), `replace` it with `body`, or leave alone one that is `foreign` (`reason`)."""

    verdict: Literal["create", "same", "replace", "foreign"]
    body: dict[str, Any] | None = None
    reason: str = ""


def write_for(
    kind: RbacKind,
    namespace: str,
    current: Mapping[str, Any] | None,
    desired: dict[str, Any],
) -> RbacWrite:
    if current is None:
        return RbacWrite("create", desired)
    name = desired["metadata"]["name"]
    if not made_by_cronlock(current):
        return RbacWrite(
            "foreign",
            reason=(
                f"{kind} {namespace}/{name} exists and was not made by cronlock (it lacks the "
                f"label {contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}); cronlock leaves it "
                "as it is, so runs of this ServiceAccount get no holder access: rename or "
                f"delete that {kind}, or give the CronJob another serviceAccountName"
            ),
        )
    if all(current.get(key) == desired[key] for key in _FIELDS[kind]) and (
        (current["metadata"].get("labels") or {}).items() >= desired["metadata"]["labels"].items()
    ):
        return RbacWrite("same")
    version = current["metadata"]["resourceVersion"]
    return RbacWrite(
        "replace", {**desired, "metadata": {**desired["metadata"], "resourceVersion": version}}
    )


def stale(labelled: Iterable[str], wanted: Iterable[str]) -> list[str]:
    """The labelled holder Roles (or RoleBindings) no guarded CronJob needs any more."""
    keep = set(wanted)
    return [name for name in labelled if name.startswith(contract.HOLDER_ROLE) and name not in keep]
