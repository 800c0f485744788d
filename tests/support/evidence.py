"""What a failed test on the real node leaves behind, so its cause is read, not guessed.

A failure of the end-to-end ring once left nothing but its assertion (a run working 60 s past
its Lease's expiry, the killed-sidecar test): the pods were gone with the namespace, and the
Lease's history with the watch. Each `cluster` test now records its Leases' every version as
it runs; when it fails, `keep` writes into one folder per test:

- `pods/<pod>/<container>.log` for every container, init containers and the native sidecar
  included, and `<container>.previous.log` where the kubelet restarted it; a pod already
  deleted keeps the sidecar log the pod recorder read when its gate decided;
- `pods.yaml`: every pod the namespace had, as last seen (statuses, exit codes, restarts);
- `events.txt`: the namespace's Events in time order;
- `leases.jsonl`: every version of every Lease the watch saw, with when it was seen;
- `kubelet.log`: the kubelet's lines that name one of the pods (every node of the test);
- `operator.log`: the operator's lines that name the namespace.

The folder is `.testenv/evidence/<test>` (CRONLOCK_EVIDENCE_DIR overrides the root); the
session's summary names it, and the rings print that summary with their logs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from tests.support.node import LeaseRecorder, PodRecorder, RealNode
from tests.support.paths import ROOT

# Set on a test whose set-up or body failed (tests/conftest.py's report hook); the folders
# kept in the session, for its summary.
FAILED_CALL = pytest.StashKey[bool]()
EVIDENCE = pytest.StashKey[list[str]]()

ROOT_DIR = Path(os.environ.get("CRONLOCK_EVIDENCE_DIR") or ROOT / ".testenv" / "evidence")


def failed(item: pytest.Item) -> bool:
    """Whether the test's set-up or body failed (asked by fixtures as they tear down)."""
    return item.stash.get(FAILED_CALL, False)


def kept(config: pytest.Config, folder: Path) -> None:
    """Name `folder` in the session's summary."""
    config.stash.setdefault(EVIDENCE, []).append(str(folder))


def folder_for(nodeid: str) -> Path:
    """One folder per test, named after its node id (path, class, parameters) readably."""
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", nodeid.replace("::", "__")).strip("_")
    return ROOT_DIR / name[:200]


def keep(
    nodeid: str,
    api: kubernetes.client.ApiClient,
    namespace: str,
    pods: PodRecorder,
    leases: LeaseRecorder,
    nodes: Iterable[RealNode],
    operator_log: str = "",
) -> Path:
    """Write the failed test's evidence (module docstring) and return its folder. Each part
    is written on its own: one that cannot be read says why in its place, and the rest stay."""
    folder = folder_for(nodeid)
    folder.mkdir(parents=True, exist_ok=True)
    core = kubernetes.client.CoreV1Api(api)
    seen = pods.pods()
    names = [str(pod["metadata"]["name"]) for pod in seen]
    uids = [str(pod["metadata"].get("uid") or "") for pod in seen]
    _write(folder / "pods.yaml", lambda: yaml.safe_dump_all(seen, sort_keys=False))
    for pod in seen:
        _container_logs(core, namespace, pod, pods, folder / "pods" / str(pod["metadata"]["name"]))
    _write(folder / "events.txt", lambda: _events(core, namespace))
    _write(
        folder / "leases.jsonl",
        lambda: "".join(json.dumps(version) + "\n" for version in leases.documents()),
    )
    _write(folder / "kubelet.log", lambda: _kubelet_lines(nodes, [*names, *filter(None, uids)]))
    _write(
        folder / "operator.log",
        lambda: "".join(line for line in operator_log.splitlines(True) if namespace in line),
    )
    return folder


def _write(path: Path, text: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        body = text()
    except Exception as error:  # noqa: BLE001 - evidence of one kind must not cost the rest
        body = f"(could not be read: {type(error).__name__}: {error})\n"
    path.write_text(body)


def _container_logs(
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    pod: dict[str, Any],
    recorder: PodRecorder,
    folder: Path,
) -> None:
    name = str(pod["metadata"]["name"])
    spec = pod.get("spec") or {}
    containers = [c["name"] for c in [*(spec.get("initContainers") or []), *spec["containers"]]]
    restarted = {
        status["name"]
        for status in [
            *((pod.get("status") or {}).get("initContainerStatuses") or []),
            *((pod.get("status") or {}).get("containerStatuses") or []),
        ]
        if status.get("restartCount")
    }
    for container in containers:
        _write(
            folder / f"{container}.log",
            lambda c=container: _log(core, name, namespace, c, False, recorder),
        )
        if container in restarted:
            _write(
                folder / f"{container}.previous.log",
                lambda c=container: _log(core, name, namespace, c, True, recorder),
            )


def _log(
    core: kubernetes.client.CoreV1Api,
    pod: str,
    namespace: str,
    container: str,
    previous: bool,
    recorder: PodRecorder,
) -> str:
    try:
        text: str = core.read_namespaced_pod_log(
            pod, namespace, container=container, previous=previous, timestamps=True
        )
    except kubernetes.client.ApiException as error:
        if container == "cronlock" and not previous:
            kept = recorder.sidecar_log(pod)
            if kept:
                return f"(the pod is gone: {error.status}; as read when its gate decided)\n{kept}"
        return f"(no log: {error.status} {error.reason})\n"
    return text


def _events(core: kubernetes.client.CoreV1Api, namespace: str) -> str:
    events = core.list_namespaced_event(namespace).items

    def when(event: Any) -> str:
        stamp = event.last_timestamp or event.event_time or event.first_timestamp
        return stamp.isoformat() if stamp else ""

    return "".join(
        f"{when(event)} {event.type} {event.reason} "
        f"{event.involved_object.kind}/{event.involved_object.name} (x{event.count or 1}): "
        f"{event.message}\n"
        for event in sorted(events, key=when)
    )


def _kubelet_lines(nodes: Iterable[RealNode], needles: list[str]) -> str:
    kept = []
    for node in nodes:
        path = node.state / "logs" / "kubelet.log"
        if not path.exists():
            kept.append(f"(node {node.name}: no kubelet log at {path})\n")
            continue
        with open(path, errors="replace") as log:
            kept.extend(f"[{node.name}] {line}" for line in log if any(n in line for n in needles))
    return "".join(kept)
