"""Generated CronJobs against the real API server and the real operator: all or nothing.

Every generated CronJob (valid Kubernetes objects from the unit strategies, with random
`cronlock.io/*` annotations, valid and invalid) is either injected completely, and then the
API server takes a real Job made from the injected template, or left exactly as stored
(resourceVersion unchanged) with an `InvalidConfig` Event: never half-patched, never
rejected by the API server because of cronlock.

`revert(inject(x)) == x` and `inject(inject(x)) == inject(x)` are unit properties
(tests/unit/operator/test_properties.py); they are not repeated here.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import secrets
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from cronlock_operator.cronjob.config import parse_config
from cronlock_operator.injection.build import revert
from cronlock_operator.kube.errors import Retry
from cronlock_operator.kube.writes import Kube
from cronlock_operator.reconcile.actions import EnsureLease
from cronlock_operator.runtime.executor import Executor
from tests.support import gen
from tests.support.contract import GATE_CONTAINER
from tests.support.cronjobs import SETTINGS, job_from_cronjob
from tests.support.kube import wait_for
from tests.support.operator import OperatorProcess
from tests.support.strategies import cronjobs, lock_annotations

pytestmark = pytest.mark.controlplane

GATE = GATE_CONTAINER
# 25 keeps CI short; CRONLOCK_PROPERTY_EXAMPLES=300 for a longer search.
SERVER = settings(
    max_examples=int(os.environ.get("CRONLOCK_PROPERTY_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Values users get wrong; some of them are fine after all (the property holds either way).
WRONG_VALUES: dict[str, list[str]] = {
    "cronlock.io/enabled": ["yes", "True", "1", ""],
    "cronlock.io/ttl": ["abc", "0s", "500ms", "25h", "-1s", "1d", "", "60"],
    "cronlock.io/renew": ["0s", "1h", "abc", "100ms", "59s"],
    "cronlock.io/policy": ["sometimes", "Skip", ""],
    "cronlock.io/wait-timeout": ["forever", "-1s", "48h", "10s"],
    "cronlock.io/stop": ["kill", "Signal", ""],
    "cronlock.io/alert-after": ["0", "-1", "x", "1001", "1.5"],
    "cronlock.io/keep-skipped-jobs": ["yes", "TRUE"],
    "cronlock.io/lock": ["UPPER", "a" * 64, "a_b", "-a", ""],
    "cronlock.io/ttl-seconds": ["30"],
}
NUMBERS = itertools.count()


@st.composite
def annotated_cronjobs(draw: st.DrawFn) -> dict[str, Any]:
    cronjob = draw(cronjobs())
    annotations = {
        key: value
        for key, value in cronjob["metadata"]["annotations"].items()
        if not key.startswith("cronlock.io/")
    }
    annotations.update(draw(lock_annotations()))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted(WRONG_VALUES)))
        annotations[key] = draw(st.sampled_from(WRONG_VALUES[key]))
    cronjob["metadata"]["annotations"] = annotations
    # Nothing should run while the property is checked.
    cronjob["spec"]["suspend"] = True
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    for container in pod.get("initContainers", []):
        # Kubernetes allows probes only on native sidecars: a strategy artefact, not ours.
        if container.get("restartPolicy") != "Always":
            container.pop("livenessProbe", None)
    return cronjob


def batch(api: kubernetes.client.ApiClient) -> kubernetes.client.BatchV1Api:
    return kubernetes.client.BatchV1Api(api)


def read(api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    stored: dict[str, Any] = api.sanitize_for_serialization(
        batch(api).read_namespaced_cron_job(name, namespace)
    )
    return stored


def invalid_config_messages(
    api: kubernetes.client.ApiClient, namespace: str, name: str
) -> list[str]:
    items = (
        kubernetes.client.CoreV1Api(api)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        .items
    )
    return [event.message for event in items if event.reason == "InvalidConfig"]


def init_names(cronjob: dict[str, Any]) -> list[str]:
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return [container["name"] for container in pod.get("initContainers") or []]


def without_empty(value: Any) -> Any:
    """Empty objects and lists dropped: the server writes `metadata: {}` where users wrote none."""
    if isinstance(value, dict):
        pruned = {key: without_empty(item) for key, item in value.items()}
        return {key: item for key, item in pruned.items() if item not in ({}, [])}
    if isinstance(value, list):
        return [without_empty(item) for item in value]
    return value


def comparable(cronjob: dict[str, Any]) -> Any:
    result = copy.deepcopy(cronjob)
    for key in ("resourceVersion", "generation", "managedFields"):
        result["metadata"].pop(key, None)
    result.pop("status", None)
    return without_empty(result)


@pytest.fixture(scope="module")
def property_namespace(api: kubernetes.client.ApiClient) -> Iterator[str]:
    name = f"properties-{secrets.token_hex(3)}"
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace(
        {"metadata": {"name": name, "labels": {"cronlock.test/namespace": "true"}}}
    )
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.mark.timeout(600)
@SERVER
@given(user=annotated_cronjobs())
def test_every_cronjob_is_injected_and_accepted_or_left_untouched_with_invalid_config(
    api: kubernetes.client.ApiClient,
    operator: OperatorProcess,
    property_namespace: str,
    user: dict[str, Any],
) -> None:
    name = f"{user['metadata']['name'][:40]}-{next(NUMBERS)}"
    user["metadata"]["name"] = name
    user["metadata"]["namespace"] = property_namespace
    note(f"annotations: {user['metadata']['annotations']}")
    # The create response, not a read: the operator may have patched it by then.
    created: dict[str, Any] = api.sanitize_for_serialization(
        batch(api).create_namespaced_cron_job(property_namespace, user)
    )
    try:

        def outcome() -> str | None:
            if init_names(read(api, property_namespace, name))[:2] == ["cronlock", GATE]:
                return "injected"
            if invalid_config_messages(api, property_namespace, name):
                return "invalid"
            return None

        try:
            decided = wait_for(outcome, timeout=30, what=f"the operator to inject or refuse {name}")
        except AssertionError as error:
            lines = [line for line in operator.log().splitlines() if name in line]
            raise AssertionError(f"{error}; operator log lines naming it: {lines}") from error
        stored = read(api, property_namespace, name)
        note(f"outcome: {decided}")
        event(decided)
        if decided == "invalid":
            assert stored["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
            messages = invalid_config_messages(api, property_namespace, name)
            assert all("cronlock.io/" in message for message in messages), messages
            assert init_names(stored) == init_names(created)
        else:
            assert not invalid_config_messages(api, property_namespace, name)
            template = stored["spec"]["jobTemplate"]
            user_inits = init_names(created)
            assert init_names(stored) == ["cronlock", GATE, *user_inits]
            assert template["spec"]["template"]["spec"]["restartPolicy"] == "Never"
            rules = template["spec"]["podFailurePolicy"]["rules"]
            assert rules[0]["onExitCodes"]["containerName"] == GATE
            assert "cronlock.io/lock" in template["metadata"]["labels"]
            assert comparable(revert(stored)) == comparable(created)
            # The API server takes a real Job made from the injected template.
            job = job_from_cronjob(stored, f"{name}-job")
            batch(api).create_namespaced_job(property_namespace, job, dry_run="All")
        rejected = re.findall(r".*(?:is invalid|Unprocessable).*", operator.log())
        assert not rejected, rejected
    finally:
        batch(api).delete_namespaced_cron_job(name, property_namespace)


def test_a_lease_deleted_behind_the_operators_cache_is_retried_not_dropped(
    api: kubernetes.client.ApiClient, property_namespace: str
) -> None:
    """Found by the property above: a CronJob neither injected nor refused, no log line.

    Its lock's Lease was owned only by a CronJob deleted a moment before; the operator's
    watch cache still had it, so the operator patched its own owner reference in, the
    garbage collector had deleted the Lease by then, and the 404 was taken for "the
    CronJob is gone": the new CronJob was never reconciled again. A 404 there must be
    retried (the next attempt creates the Lease).
    """
    user = gen.cronjob(
        "behind-the-cache",
        *gen.BY_HAND,
        gen.not_opted_in(),
        gen.containers({"name": "main", "image": "busybox:1.37"}),
        gen.with_spec(suspend=True),
    )
    cronjob: dict[str, Any] = api.sanitize_for_serialization(
        batch(api).create_namespaced_cron_job(property_namespace, user)
    )
    # What the cache held: the Lease of the deleted CronJob, already gone on the server.
    cached = {
        "metadata": {
            "name": "cronlock-behind-the-cache",
            "namespace": property_namespace,
            "labels": {"app.kubernetes.io/managed-by": "cronlock"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": "deleted", "uid": "0000"}
            ],
        }
    }
    # The deleted CronJob as the cache still had it, consenting to the new one: the
    # executor joins the Lease, and the API server answers 404.
    deleted = {
        "metadata": {
            "name": "deleted",
            "uid": "0000",
            "annotations": {"cronlock.io/share-lock-with": "behind-the-cache"},
        }
    }
    ensure = EnsureLease(
        property_namespace,
        "cronlock-behind-the-cache",
        cronjob,
        parse_config(cronjob, SETTINGS),
        cached,
        {"deleted": deleted},
    )
    with pytest.raises(Retry, match="vanished; creating it again"):
        Executor(Kube(api)).run([ensure])
