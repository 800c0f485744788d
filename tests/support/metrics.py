"""What the operator's metrics registry says, as the unit tests read it."""

from __future__ import annotations

from cronlock_operator.runtime import metrics


def cronjob_states(namespace: str | None = None) -> dict[str, float]:
    """cronlock_cronjobs by state, in `namespace` or summed over all of them."""
    totals = dict.fromkeys(metrics.CRONJOB_STATES, 0.0)
    for family in metrics.registry.collect():
        if family.name != "cronlock_cronjobs":
            continue
        for sample in family.samples:
            if namespace is None or sample.labels["namespace"] == namespace:
                totals[sample.labels["state"]] += sample.value
    return totals
