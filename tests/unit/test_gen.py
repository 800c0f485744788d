"""The test builders (tests/support/gen.py) write objects the Kubernetes API defines, and a
modifier changes only what it names."""

from __future__ import annotations

import copy
import json

from kubernetes.client import ApiClient

from tests.support import gen
from tests.support.cronjobs import as_kubernetes_models_see_it, pod_spec

EVERY_MODIFIER = (
    *gen.BY_HAND,
    gen.in_namespace("team-b"),
    gen.annotated({"cronlock.io/ttl": "19s"}),
    gen.in_store("redis", "team-locks"),
    gen.labelled({"team": "billing"}),
    gen.with_uid("u-report"),
    gen.with_metadata(generation=2),
    gen.with_spec(suspend=True, startingDeadlineSeconds=20),
    gen.with_status({"active": [{"kind": "Job", "name": "report-1"}]}),
    gen.with_job(backoffLimit=0),
    gen.with_job_labels({"tier": "batch"}),
    gen.service_account("reports"),
    gen.on_the_node("localhost/busybox:cronlock", "echo hi", {"name": "A", "value": "b"}),
    gen.with_pod(nodeSelector={"kubernetes.io/hostname": "n1"}),
    gen.as_stored(),
)


def test_every_modifier_writes_only_fields_the_api_defines() -> None:
    """Read into the client's V1CronJob and out again, a misspelt or misplaced field would
    drop out: nothing does."""
    body = gen.cronjob("report", *EVERY_MODIFIER)
    assert as_kubernetes_models_see_it(body) == body


def test_a_job_and_a_pod_are_what_the_api_defines_too() -> None:
    """(Timestamps stay out: the client writes them back as +00:00.)"""
    client = ApiClient()
    job = gen.job(
        "report-1",
        gen.in_namespace("team-a"),
        gen.of_lock("report"),
        gen.owned_by("report", "u-report"),
        gen.gated(),
        gen.skipped("team-a"),
    )
    job["spec"]["template"]["spec"]["containers"] = [{"name": "main", "image": "x"}]
    holder = gen.pod(
        "report-1-abcde",
        "reports",
        gen.in_namespace("team-a"),
        gen.with_uid("u-pod"),
        gen.controlled_by("Job", "report-1", "uid-report-1"),
    )
    for body, kind in ((job, "V1Job"), (holder, "V1Pod")):
        model = client.deserialize(json.dumps(body), kind, "application/json")
        assert client.sanitize_for_serialization(model) == body  # type: ignore[no-untyped-call]


def test_a_modifier_changes_what_it_names_and_nothing_else() -> None:
    plain = gen.cronjob("report")
    moved = gen.cronjob("report", gen.in_namespace("team-b"))
    assert moved["metadata"]["namespace"] == "team-b"
    moved["metadata"]["namespace"] = plain["metadata"]["namespace"]
    assert moved == plain
    no_namespace = gen.cronjob("report", gen.in_namespace(None))
    assert "namespace" not in no_namespace["metadata"]
    # Later modifiers win, and the annotation modifiers add or replace as they say.
    annotated = gen.cronjob("report", gen.annotated({"cronlock.io/ttl": "19s"}))
    assert annotated["metadata"]["annotations"] == {
        "cronlock.io/enabled": "true",
        "cronlock.io/ttl": "19s",
    }
    assert gen.cronjob("report", gen.not_opted_in())["metadata"]["annotations"] == {}
    assert pod_spec(gen.cronjob("r", gen.restart_policy("Never")))["restartPolicy"] == "Never"


def test_builders_share_nothing_between_the_objects_they_build() -> None:
    containers = gen.containers({"name": "main", "image": "x", "env": []})
    first, second = gen.cronjob("a", containers), gen.cronjob("b", containers)
    before = copy.deepcopy(second)
    pod_spec(first)["containers"][0]["env"].append({"name": "X", "value": "1"})
    first["metadata"]["annotations"]["x"] = "y"
    assert second == before
