"""The kopf wiring: the watches' server-side label selectors are the handlers' filters."""

from __future__ import annotations

import kopf
from kopf._cogs.structs.references import Resource  # kopf's own resource record

from cronlock_operator.runtime import handlers
from cronlock_sidecar import contract


def _handler_labels() -> dict[tuple[str, str], dict[str, object] | None]:
    registry = kopf.get_default_registry()
    return {
        (str(handler.selector.group), str(handler.selector.any_name)): handler.labels
        for handler in registry._watching.get_all_handlers()
    }


def test_every_label_filtered_handler_has_the_same_selector_on_its_watch() -> None:
    filters = _handler_labels()
    filtered = {resource for resource, labels in filters.items() if labels}
    assert filtered == set(handlers.SERVER_SIDE_SELECTORS)
    assert filters[("batch", "jobs")] == {contract.LABEL_LOCK: kopf.PRESENT}
    assert handlers.SERVER_SIDE_SELECTORS[("batch", "jobs")] == contract.LABEL_LOCK
    assert filters[("coordination.k8s.io", "leases")] == {
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY
    }
    assert handlers.SERVER_SIDE_SELECTORS[("coordination.k8s.io", "leases")] == (
        "app.kubernetes.io/managed-by=cronlock"
    )
    # CronJobs opt in by annotation, which no selector can match: that watch stays whole.
    assert filters[("batch", "cronjobs")] is None


def test_the_selectors_reach_the_watch_of_their_resource_only() -> None:
    settings = kopf.OperatorSettings()
    handlers.select_server_side(settings)
    leases = Resource("coordination.k8s.io", "v1", "leases", kind="Lease", namespaced=True)
    jobs = Resource("batch", "v1", "jobs", kind="Job", namespaced=True)
    cronjobs = Resource("batch", "v1", "cronjobs", kind="CronJob", namespaced=True)
    assert settings.watching.label_selectors.collect(leases) == [handlers.LEASE_SELECTOR]
    assert settings.watching.label_selectors.collect(jobs) == [handlers.JOB_SELECTOR]
    assert settings.watching.label_selectors.collect(cronjobs) == []
