"""Runs' pods without a node: a Job made from a CronJob as `kubectl create job --from` makes
it (owned by the CronJob), whose pods the Job controller creates and no kubelet starts. The
operator tells a run's pod by that ownership (reconcile/holders.py)."""

from __future__ import annotations

from typing import Any

import kubernetes

from tests.support.cronjobs import job_from_cronjob
from tests.support.kube import wait_for
from tests.support.objects import read


def job_from(
    api: kubernetes.client.ApiClient, namespace: str, cronjob: str, job: str, pods: int = 1
) -> None:
    """The Job `job` as `kubectl create job --from=cronjob/...` makes it, with room for
    `pods` pods at once (a run and its retries); nothing if it exists."""
    body = job_from_cronjob(read(api, namespace, cronjob), job)
    body["spec"] = {**body["spec"], "parallelism": pods, "completions": pods}
    try:
        kubernetes.client.BatchV1Api(api).create_namespaced_job(namespace, body)
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise


def pod_of(
    api: kubernetes.client.ApiClient, namespace: str, job: str, taken: set[str] | None = None
) -> Any:
    """A pod the Job controller made for `job` whose name is not in `taken` (then added)."""
    core = kubernetes.client.CoreV1Api(api)
    seen = taken if taken is not None else set()

    def untaken() -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
        return next((pod for pod in pods if pod.metadata.name not in seen), None)

    pod = wait_for(untaken, 30, f"a pod of Job {job}")
    seen.add(pod.metadata.name)
    return pod
