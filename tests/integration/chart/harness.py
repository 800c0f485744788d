"""The chart under test and what its tests share: `helm`, rendering, a namespace labelled
restricted, a pod dry-run, the Deployment's env."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool
from tests.support.operator import kube_version
from tests.support.paths import ROOT

CHART = ROOT / "charts" / "cronlock"


RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}


# Every value set to something other than its default (watchNamespaces filled in per test).
NON_DEFAULT: dict[str, Any] = {
    "image": {
        "repository": "registry.example.com/platform/cronlock",
        "tag": "0.1.0-rc.1",
        "pullPolicy": "Always",
    },
    "sidecarImage": {
        "repository": "registry.example.com/platform/cronlock-sidecar",
        "tag": "sha-0123abc",
        "pullPolicy": "Always",
    },
    "watchNamespaces": ["team-a", "team-b"],
    "namespaceOptIn": False,
    "defaults": {"ttl": "2m", "renew": "30s", "policy": "wait"},
    "logFormat": "json",
    "metrics": {"port": 9090},
    "liveness": {"port": 9091},
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
    "resources": {
        "requests": {"cpu": "20m", "memory": "64Mi"},
        "limits": {"cpu": 1, "memory": "128Mi"},
    },
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/arch",
                                "operator": "In",
                                "values": ["amd64", "arm64"],
                            }
                        ]
                    }
                ]
            }
        }
    },
    "podAnnotations": {"example.com/team": "ops"},
    "podLabels": {"example.com/team": "ops"},
    "imagePullSecrets": [{"name": "regcred"}],
    "nameOverride": "lock",
    "fullnameOverride": "",
    "serviceAccount": {
        "create": True,
        "name": "cronlock-operator",
        "annotations": {"example.com/role": "cronlock"},
    },
}


def helm(
    controlplane: ControlPlane, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if args[:1] == ("template",):
        args = (*args, "--kube-version", kube_version())
    return run_tool(controlplane.env, "helm", *args, check=check, timeout=90, cwd=ROOT)


def values_file(directory: Path, values: dict[str, Any]) -> str:
    path = directory / f"values-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def render(controlplane: ControlPlane, *args: str, tests: bool = False) -> list[dict[str, Any]]:
    """`helm template`; without `helm test`'s objects unless `tests`."""
    skip = () if tests else ("--skip-tests",)
    output = helm(controlplane, "template", "cronlock", str(CHART), *skip, *args).stdout
    return [doc for doc in yaml.safe_load_all(output) if doc]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(doc["kind"] for doc in docs)


def label_restricted(controlplane: ControlPlane, namespace: str) -> None:
    controlplane.kubectl(
        "label",
        "namespace",
        namespace,
        "--overwrite",
        *(f"{key}={value}" for key, value in RESTRICTED.items()),
    )


def dry_run_pod(
    controlplane: ControlPlane, namespace: str, template: dict[str, Any], *flags: str
) -> str:
    """Create a Pod from a pod template with a server-side dry run (PodSecurity enforces);
    `flags` for kubectl, e.g. `-o json` for the Pod as admitted."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"dry-run-{secrets.token_hex(3)}",
            "namespace": namespace,
            "labels": (template.get("metadata") or {}).get("labels") or {},
        },
        "spec": template["spec"],
    }
    return controlplane.kubectl(
        "create", "--dry-run=server", "-n", namespace, *flags, "-f", "-",
        input_text=json.dumps(pod),
    )  # fmt: skip


def deployment_env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", "") for item in container["env"]}


Install = Callable[..., str]
