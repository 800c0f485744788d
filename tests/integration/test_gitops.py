"""What a GitOps tool does to an injected CronJob: re-apply the user's own manifest, with
client-side `kubectl apply` (Argo CD's default) and with server-side apply forcing
conflicts (what Flux's kustomize-controller does), on the real API server."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.support import gen
from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool, wait_for
from tests.support.objects import Versions, read
from tests.support.operator import kube_version

pytestmark = pytest.mark.usefixtures("operator")
CHART = Path(__file__).resolve().parents[2] / "charts" / "cronlock"
ORIGINAL = "cronlock.io/original-restart-policy"


def injected(body: dict[str, Any]) -> bool:
    spec = body["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    names = [c["name"] for c in spec.get("initContainers") or []]
    return names[:2] == ["cronlock", "cronlock-gate"] and spec["restartPolicy"] == "Never"


def manifest(namespace: str, restart_policy: str) -> str:
    body = gen.cronjob(
        "report", gen.in_namespace(namespace), gen.never_due(), gen.restart_policy(restart_policy)
    )
    return yaml.safe_dump(body)


def test_re_applying_a_never_manifest_both_ways_keeps_the_injection_at_every_version(
    api: kubernetes.client.ApiClient, namespace: str, controlplane: ControlPlane
) -> None:
    text = manifest(namespace, "Never")
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    first = wait_for(
        lambda: body if injected(body := read(api, namespace, "report")) else None,
        30,
        "the injection",
    )
    versions = Versions(api, namespace, first["metadata"]["resourceVersion"])

    controlplane.kubectl("apply", "-f", "-", input_text=text)
    controlplane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=kustomize-controller",
        "-f",
        "-",
        input_text=text,
    )
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    wait_for(lambda: injected(read(api, namespace, "report")), 30, "the injection after it all")
    seen = versions.stop()
    assert seen, "the watch saw no version at all"

    # No version a run could have started from lacked the lock.
    assert all(injected(body) for body in seen), [
        body["metadata"]["resourceVersion"] for body in seen if not injected(body)
    ]
    last = read(api, namespace, "report")
    assert last["spec"]["jobTemplate"] == first["spec"]["jobTemplate"]


def test_without_the_mutating_policy_an_on_failure_manifest_is_refused_and_the_injection_stays(
    api: kubernetes.client.ApiClient, namespace: str, controlplane: ControlPlane
) -> None:
    """Before Kubernetes 1.36 (or with admissionPolicy.onFailureToNever=false): the API
    server refuses `OnFailure` next to cronlock's podFailurePolicy, whichever way it is
    applied; hence the README's advice to write `Never` in Git there."""
    text = manifest(namespace, "OnFailure")
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    wait_for(lambda: injected(read(api, namespace, "report")), 30, "the injection")

    for args in (
        ("apply", "-f", "-"),
        ("apply", "--server-side", "--force-conflicts", "--field-manager=flux", "-f", "-"),
    ):
        answer = controlplane.kubectl(*args, check=False, input_text=text)
        assert "podFailurePolicy" in answer, answer
        assert "Never" in answer, answer
        assert injected(read(api, namespace, "report"))


@pytest.fixture
def mutating_policy(controlplane: ControlPlane, namespace: str) -> Iterator[str]:
    """The chart's MutatingAdmissionPolicy and its binding, scoped to the test's namespace
    (watchNamespaces), applied as `helm install` would on this API server; deleted after."""
    rendered = run_tool(
        controlplane.env,
        "helm",
        "template",
        f"gitops-{secrets.token_hex(3)}",
        str(CHART),
        "-n",
        "cronlock-system",
        "--kube-version",
        kube_version(),
        "--api-versions",
        "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
        "--set",
        f"watchNamespaces={{{namespace}}}",
        "--show-only",
        "templates/mutating-policy.yaml",
    ).stdout
    controlplane.kubectl("apply", "-f", "-", input_text=rendered)
    yield rendered
    controlplane.kubectl("delete", "-f", "-", "--ignore-not-found", input_text=rendered)


def test_with_the_mutating_policy_an_on_failure_manifest_applies_both_ways_and_stays_injected(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    mutating_policy: str,
) -> None:
    text = manifest(namespace, "OnFailure")
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    first = wait_for(
        lambda: body if injected(body := read(api, namespace, "report")) else None,
        30,
        "the injection",
    )
    assert first["metadata"]["annotations"][ORIGINAL] == "OnFailure"  # the operator's record
    # The API server takes up a new policy within moments; a server-side dry run of the
    # re-apply passes through admission without storing anything.
    wait_for(
        lambda: (
            run_tool(
                controlplane.env,
                "kubectl",
                "apply",
                "--dry-run=server",
                "-f",
                "-",
                input_text=text,
                check=False,
            ).returncode
            == 0
        ),
        30,
        "the API server to take up the MutatingAdmissionPolicy",
    )
    versions = Versions(api, namespace, first["metadata"]["resourceVersion"])

    for args in (
        ("apply", "-f", "-"),
        ("apply", "--server-side", "--force-conflicts", "--field-manager=flux", "-f", "-"),
        ("apply", "-f", "-"),
    ):
        controlplane.kubectl(*args, input_text=text)  # accepted: check=True
    wait_for(lambda: injected(read(api, namespace, "report")), 30, "the injection after it all")
    seen = versions.stop()
    assert seen, "the watch saw no version at all"

    assert all(injected(body) for body in seen), [
        body["metadata"]["resourceVersion"] for body in seen if not injected(body)
    ]
    last = read(api, namespace, "report")
    assert last["metadata"]["annotations"][ORIGINAL] == "OnFailure"  # still restored on revert
    assert last["spec"]["jobTemplate"] == first["spec"]["jobTemplate"]


def test_the_mutating_policy_leaves_a_cronjob_cronlock_did_not_inject_as_written(
    api: kubernetes.client.ApiClient,
    namespace: str,
    controlplane: ControlPlane,
    mutating_policy: str,
) -> None:
    """Not injected (not annotated): its OnFailure is the user's, and stays."""
    body = gen.cronjob("plain", gen.in_namespace(namespace), gen.never_due(), gen.not_opted_in())
    controlplane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(body))
    stored = read(api, namespace, "plain")
    assert stored["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] == (
        "OnFailure"
    )
    assert ORIGINAL not in (stored["metadata"].get("annotations") or {})


# What cronlock's own field manager owns once it injected a plain CronJob (OnFailure, a
# container without a probe, the default 30 s grace), as readable paths: exactly the list
# docs/USAGE.md gives for Argo CD's and Flux's users (checked below against the doc).
OWNED_BY_CRONLOCK = {
    "metadata.annotations.cronlock.io/original-restart-policy",
    "metadata.annotations.cronlock.io/original-termination-grace-period-seconds",
    "spec.jobTemplate.metadata.labels.cronlock.io/lock",
    "spec.jobTemplate.spec.podFailurePolicy",
    "spec.jobTemplate.spec.template.metadata.labels.cronlock.io/lock",
    'spec.jobTemplate.spec.template.spec.initContainers[name="cronlock"]',
    'spec.jobTemplate.spec.template.spec.initContainers[name="cronlock-gate"]',
    'spec.jobTemplate.spec.template.spec.volumes[name="cronlock"]',
    'spec.jobTemplate.spec.template.spec.containers[name="main"].volumeMounts[mountPath="/var/run/cronlock"]',
    'spec.jobTemplate.spec.template.spec.containers[name="main"].livenessProbe',
    "spec.jobTemplate.spec.template.spec.restartPolicy",
    "spec.jobTemplate.spec.template.spec.terminationGracePeriodSeconds",
}


# Maps and lists a CronJob's author and cronlock both write into: ownership is read
# inside them (which keys, which elements), not of the map or list as a whole.
SHARED = {
    "metadata",
    "annotations",
    "labels",
    "spec",
    "jobTemplate",
    "template",
    "initContainers",
    "containers",
    "volumes",
    "volumeMounts",
}


def owned_paths(fields: dict[str, Any], prefix: str = "") -> set[str]:
    """The fields a managedFields entry (FieldsV1) owns, as readable paths: inside the
    SHARED maps and lists each key or element, anything else as a whole."""
    paths: set[str] = set()
    for key, child in fields.items():
        if key == ".":
            continue
        kind, _, name = key.partition(":")
        if kind == "f":
            path = f"{prefix}.{name}" if prefix else name
            shared = name in SHARED
        else:  # "k:" an element by its keys
            keys = json.loads(name)
            path = prefix + "".join(f"[{k}={json.dumps(v)}]" for k, v in keys.items())
            shared = "." not in child
        inner = {k: v for k, v in child.items() if k != "."}
        if shared and inner:
            paths |= owned_paths(inner, path)
        else:
            paths.add(path)
    return paths


def test_cronlocks_field_manager_owns_exactly_the_paths_the_docs_list(
    api: kubernetes.client.ApiClient, namespace: str, controlplane: ControlPlane
) -> None:
    """Issue 24: Argo CD's `managedFieldsManagers: [cronlock]` and Flux's server-side
    apply both go by managedFields; they are only as right as the fields cronlock owns."""
    text = manifest(namespace, "OnFailure")
    controlplane.kubectl(
        "apply", "--server-side", "--field-manager=argocd-controller", "-f", "-", input_text=text
    )
    body = wait_for(
        lambda: body if injected(body := read(api, namespace, "report")) else None,
        30,
        "the injection",
    )
    entries = [
        entry for entry in body["metadata"]["managedFields"] if entry["manager"] == "cronlock"
    ]
    assert [entry["operation"] for entry in entries] == ["Update"]
    owned = owned_paths(entries[0]["fieldsV1"])
    assert owned == OWNED_BY_CRONLOCK, "\n".join(sorted(owned))
    users = [entry for entry in body["metadata"]["managedFields"] if entry["manager"] != "cronlock"]
    assert [entry["manager"] for entry in users] == ["argocd-controller"]
    documented = (Path(__file__).resolve().parents[2] / "docs" / "USAGE.md").read_text()
    assert [path for path in sorted(OWNED_BY_CRONLOCK) if f"`{path}`" not in documented] == []
