"""Hypothesis strategies: CronJobs as users write them, opted in, in many shapes (the
injection properties in the unit ring, the same against the API server in the integration
ring)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.support import gen

names = st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
probes = st.sampled_from(
    [
        {"exec": {"command": ["cat", "/tmp/healthy"]}},
        {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5},
        {"tcpSocket": {"port": "http"}},
    ]
)
user_annotations = st.dictionaries(
    st.sampled_from(["example.com/owner", "kubectl.kubernetes.io/last-applied-configuration"]),
    st.text(max_size=10),
    max_size=2,
)
# Absent, 0, under, equal to and over the kill graces the ttls below give (1s, 6s, 10s).
graces = st.one_of(
    st.none(), st.sampled_from([0, 1, 2, 6, 7, 10, 11, 30, 120]), st.integers(0, 7 * 24 * 3600)
)
labels = st.dictionaries(
    st.sampled_from(["app", "team", "app.kubernetes.io/name"]), names, min_size=1, max_size=2
)


@st.composite
def lock_annotations(draw: st.DrawFn) -> dict[str, str]:
    """cronlock.io/* settings that are valid on their own."""
    annotations = {"cronlock.io/enabled": "true"}
    if draw(st.booleans()):
        annotations["cronlock.io/lock"] = draw(names)
    ttl = draw(st.sampled_from([None, "19s", "30s", "1m", "5m", "1h", "24h"]))
    if ttl is not None:
        annotations["cronlock.io/ttl"] = ttl
        if draw(st.booleans()):
            annotations["cronlock.io/renew"] = draw(st.sampled_from(["1s", "2s", "3500ms"]))
    policy = draw(st.sampled_from([None, "skip", "wait"]))
    if policy is not None:
        annotations["cronlock.io/policy"] = policy
    if policy == "wait" and draw(st.booleans()):
        annotations["cronlock.io/wait-timeout"] = draw(st.sampled_from(["0s", "10s", "1m30s"]))
    stop = draw(st.sampled_from([None, "auto", "liveness", "signal"]))
    if stop is not None:
        annotations["cronlock.io/stop"] = stop
    if draw(st.booleans()):
        annotations["cronlock.io/alert-after"] = str(draw(st.integers(1, 1000)))
    if draw(st.booleans()):
        annotations["cronlock.io/keep-skipped-jobs"] = draw(st.sampled_from(["true", "false"]))
    return annotations


@st.composite
def containers(
    draw: st.DrawFn, container_names: list[str], volumes: list[str]
) -> list[dict[str, Any]]:
    result = []
    for name in container_names:
        container: dict[str, Any] = {"name": name, "image": f"registry.example.com/{name}:1"}
        if draw(st.booleans()):
            container["command"] = ["sh", "-c", draw(st.sampled_from(["true", "sleep 5"]))]
        if draw(st.booleans()):
            container["env"] = [{"name": "MODE", "value": draw(st.sampled_from(["a", "b"]))}]
        if draw(st.booleans()):
            container["ports"] = [{"name": "http", "containerPort": 8080}]
        if draw(st.integers(0, 3)) == 0:
            container["livenessProbe"] = draw(probes)
        mount = draw(st.booleans())
        if volumes and mount:
            mounted = draw(st.sampled_from(volumes))
            container["volumeMounts"] = [{"name": mounted, "mountPath": f"/{mounted}"}]
        if draw(st.integers(0, 3)) == 0:
            container["securityContext"] = {"runAsUser": 1000, "readOnlyRootFilesystem": True}
        result.append(container)
    return result


@st.composite
def cronjobs(draw: st.DrawFn) -> dict[str, Any]:
    """A CronJob as a user would write it, opted in, in many shapes."""
    volume_names = draw(
        st.lists(st.sampled_from(["data", "cache", "config"]), unique=True, max_size=2)
    )
    container_names = draw(
        st.lists(
            st.sampled_from(["main", "worker", "exporter", "proxy"]),
            unique=True,
            min_size=1,
            max_size=3,
        )
    )
    init_names = draw(
        st.lists(st.sampled_from(["setup", "migrate", "log-shipper"]), unique=True, max_size=2)
    )
    restart_policy = draw(st.sampled_from(["OnFailure", "Never"]))
    pod: dict[str, Any] = {}
    if init_names:
        pod["initContainers"] = draw(containers(init_names, volume_names))
        if "log-shipper" in init_names:
            # A user's own native sidecar.
            pod["initContainers"][init_names.index("log-shipper")]["restartPolicy"] = "Always"
    if volume_names:
        pod["volumes"] = [
            {"name": name, "emptyDir": {}}
            if name != "config"
            else {"name": name, "configMap": {"name": "settings"}}
            for name in volume_names
        ]
    if draw(st.booleans()):
        pod["securityContext"] = {"runAsUser": 1000, "runAsNonRoot": True}
    share = draw(st.sampled_from([None, True, False]))
    if share is not None:
        pod["shareProcessNamespace"] = share
    if draw(st.booleans()):
        pod["serviceAccountName"] = "reporter"
    grace = draw(graces)
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace

    cronjob = gen.cronjob(
        draw(names),
        gen.in_namespace(draw(st.sampled_from(["default", "team-a", "billing"]))),
        gen.restart_policy(restart_policy),
        gen.with_annotations({**draw(user_annotations), **draw(lock_annotations())}),
        gen.containers(*draw(containers(container_names, volume_names))),
        gen.with_pod(**pod),
    )
    job_template = cronjob["spec"]["jobTemplate"]
    if draw(st.booleans()):
        job_template["metadata"] = {"labels": draw(labels)}
    if draw(st.booleans()):
        job_template["spec"]["template"]["metadata"] = {"labels": draw(labels)}
    if draw(st.booleans()):
        job_template["spec"]["backoffLimit"] = draw(st.integers(0, 6))
    if restart_policy == "Never" and draw(st.booleans()):
        rules = [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [0, 1]}},
        ]
        job_template["spec"]["podFailurePolicy"] = {
            "rules": draw(st.lists(st.sampled_from(rules), min_size=1, max_size=3))
        }
    return cronjob
