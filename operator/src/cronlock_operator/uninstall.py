"""`cronlock-operator --uninstall`: every injected CronJob back as its user wrote it, and
what cronlock made (Leases, holder Roles and RoleBindings) deleted; then exit.

The chart runs it as a post-delete hook when `uninstall.revert` is set, and as a
post-upgrade hook for the namespaces an upgrade stopped watching (`upgrade.revertDropped`;
`keep` then names the namespaces still watched, when the old watch was every namespace).
An operator that is still stopping could inject a CronJob again meanwhile, so CronJobs are
looked at again until a whole pass finds none injected (or `settle` seconds have passed:
then the exit code says so, naming them). A CronJob whose record of the injection its
author made unreadable is left injected with a `NotReverted` Warning on it, and fails no
hook: anyone who may edit one CronJob would otherwise fail every uninstall and every
narrowing upgrade (security review L5). A CronJob keeps its `cronlock.io/*` annotations:
installing cronlock again guards it again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from cronlock_operator.cronjob.config import InvalidConfig
from cronlock_operator.injection.build import is_injected, revert
from cronlock_operator.injection.patching import injection_patch
from cronlock_operator.kube.answers import answered, done, raw
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.errors import APIError, NotFound, Rejected, Retry
from cronlock_operator.kube.writes import Kube
from cronlock_operator.leases.ownership import made_by_cronlock
from cronlock_sidecar import contract

logger = logging.getLogger(__name__)

SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
PASS_PAUSE = 2.0


def uninstall(
    kube: Kube,
    namespaces: Sequence[str],
    *,
    keep: Sequence[str] = (),
    revert_only: bool = False,
    settle: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """0 when every CronJob is reverted (or told why it cannot be) and everything cronlock
    made is deleted, else 1.

    `kube`: the API server's calls (the tests' in-memory one in unit tests).
    """
    started = time.monotonic()
    left: list[str] = []
    # CronJobs whose record of the injection cannot be read back: left as they are, told,
    # and not tried again (their annotations will not change by waiting).
    unrevertable: dict[str, tuple[str, dict[str, Any]]] = {}
    while True:
        reverted, left = _revert_pass(kube, namespaces, frozenset(keep), unrevertable)
        if not reverted and not left:
            break
        if time.monotonic() - started > settle:
            break
        sleep(PASS_PAUSE)
    if revert_only:
        logger.info("uninstall: Leases and holder Roles left to the runs still in progress")
    else:
        deleted = _delete_ours(kube, namespaces, frozenset(keep))
        logger.info("uninstall: %d objects cronlock made deleted", deleted)
    for name, (reason, body) in sorted(unrevertable.items()):
        logger.error("uninstall: %s left injected, revert it by hand: %s", name, reason)
        _tell(kube, body, reason)
    if left:
        logger.error(
            "uninstall: still injected after %.0fs (is an operator still running?): %s",
            settle,
            ", ".join(left),
        )
        return 1
    if not unrevertable:
        logger.info("uninstall: every CronJob is as its user wrote it")
    return 0


def _tell(kube: Kube, body: dict[str, Any], reason: str) -> None:
    """A `NotReverted` Warning on a CronJob left injected: its owners see it there."""
    message = (
        f"cronlock was uninstalled but could not revert this CronJob: {reason}. Remove "
        "cronlock's sidecar, gate and cronlock.io/original-* annotations by hand"
    )
    try:
        kube.post_event(body, "NotReverted", message, warning=True)
    except APIError as error:
        logger.warning("uninstall: no NotReverted Event posted: %s", error.reason)


def _revert_pass(
    kube: Kube,
    namespaces: Sequence[str],
    keep: frozenset[str],
    unrevertable: dict[str, tuple[str, dict[str, Any]]],
) -> tuple[int, list[str]]:
    """Revert what is injected now: (how many were reverted, which could not be yet).

    A CronJob whose `cronlock.io/original-*` record holds a value cronlock never writes is
    added to `unrevertable` instead: one odd CronJob never stops the others' revert."""
    cronjobs = ObjectCache()
    kube.list_cronjobs(namespaces, cronjobs)
    reverted, failed = 0, []
    for namespace, name in sorted(cronjobs.keys()):
        body = cronjobs.get((namespace, name))
        where = f"{namespace}/{name}"
        if namespace in keep or body is None or not is_injected(body) or where in unrevertable:
            continue
        try:
            patch = injection_patch(body, revert(body))
        except InvalidConfig as error:
            unrevertable[where] = (str(error), body)
            continue
        try:
            kube.patch_cronjob(namespace, name, patch)
        except (Retry, Rejected) as error:
            logger.warning("uninstall: %s/%s not reverted yet: %s", namespace, name, error)
            failed.append(where)
            continue
        logger.info("uninstall: %s reverted", where)
        reverted += 1
    return reverted, failed


def _delete_ours(kube: Kube, namespaces: Sequence[str], keep: frozenset[str]) -> int:
    """Delete the Leases, holder Roles and RoleBindings labelled as cronlock's."""
    deleted = 0
    scopes: Sequence[str | None] = list(namespaces) or [None]
    kinds = (
        ("lease", kube.leases.list_namespaced_lease, kube.leases.list_lease_for_all_namespaces,
         kube.leases.delete_namespaced_lease),
        ("rolebinding", kube.rbac.list_namespaced_role_binding,
         kube.rbac.list_role_binding_for_all_namespaces, kube.rbac.delete_namespaced_role_binding),
        ("role", kube.rbac.list_namespaced_role, kube.rbac.list_role_for_all_namespaces,
         kube.rbac.delete_namespaced_role),
    )  # fmt: skip
    for kind, list_in, list_all, delete in kinds:
        for scope in scopes:
            with answered(f"list {kind}s" + (f" in namespace {scope}" if scope else "")):
                page = raw(
                    list_all(label_selector=SELECTOR, _preload_content=False)
                    if scope is None
                    else list_in(scope, label_selector=SELECTOR, _preload_content=False)
                )
            for item in page.get("items") or []:
                metadata = item["metadata"]
                if metadata["namespace"] in keep or not made_by_cronlock(item):
                    continue
                if kind != "lease" and not metadata["name"].startswith(contract.HOLDER_ROLE):
                    continue  # a Role or RoleBinding of the chart, not a holder's
                what = f"delete {kind} {metadata['namespace']}/{metadata['name']}"
                with contextlib.suppress(NotFound), answered(what):
                    done(delete(metadata["name"], metadata["namespace"], _preload_content=False))
                deleted += 1
    return deleted
