"""One run of a guarded CronJob on the real node, as a user's manual run makes it."""

from __future__ import annotations

import kubernetes

from tests.support.cronjobs import job_from_cronjob
from tests.support.helm import guard
from tests.support.kube import wait_for
from tests.support.node import BUSYBOX_IMAGE
from tests.support.objects import read

# A container that passes the restricted Pod Security Standard.
RESTRICTED_CONTAINER = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def guard_and_run(
    api: kubernetes.client.ApiClient, namespace: str, sidecar_ref: str, sidecar_digest: str
) -> None:
    """A CronJob guarded by the installed operator, which injects `sidecar_ref`, and one run
    of it on the node: it completes, every injected container's image that digest."""
    guard(api, namespace, "report")
    cronjob = read(api, namespace, "report")
    template = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    injected_images = {
        container["image"]
        for container in template.get("initContainers", []) + template["containers"]
        if container["name"] != "main"
    }
    assert injected_images == {sidecar_ref}
    template["restartPolicy"] = "Never"
    (main,) = (c for c in template["containers"] if c["name"] == "main")
    main.update(
        image=BUSYBOX_IMAGE,
        imagePullPolicy="Never",
        command=["sh", "-c", "echo guarded work"],
        securityContext=RESTRICTED_CONTAINER,
    )
    batch = kubernetes.client.BatchV1Api(api)
    batch.create_namespaced_job(namespace, job_from_cronjob(cronjob, "report-1"))

    def finished() -> str | None:
        job = batch.read_namespaced_job("report-1", namespace)
        for condition in job.status.conditions or []:
            if condition.type in ("Complete", "Failed") and condition.status == "True":
                return str(condition.type)
        return None

    assert wait_for(finished, 240, "the guarded Job to finish") == "Complete"
    core = kubernetes.client.CoreV1Api(api)
    (run,) = core.list_namespaced_pod(namespace, label_selector="job-name=report-1").items
    pulled = {
        status.name: status.image_id
        for status in (run.status.init_container_statuses or []) + run.status.container_statuses
    }
    assert all(
        image_id.endswith(sidecar_digest) for image, image_id in pulled.items() if image != "main"
    ), pulled
    log = core.read_namespaced_pod_log(run.metadata.name, namespace, container="main")
    assert log == "guarded work\n"
