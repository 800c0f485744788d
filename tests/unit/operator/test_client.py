"""One way every cronlock command connects: --kubeconfig, $KUBECONFIG, the pod, ~/.kube/config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest

from cronlock_operator.kube import client, errors

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.10:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: reports}}]
current-context: x
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return str(path)


@pytest.fixture
def in_a_pod(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """KUBERNETES_SERVICE_HOST set, and a ServiceAccount loader that records being used."""
    used: list[str] = []

    def load_incluster_config(client_configuration: Any) -> None:
        used.append("in-cluster")
        client_configuration.host = "https://198.51.100.1:443"

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "198.51.100.1")
    monkeypatch.setattr(kubernetes.config, "load_incluster_config", load_incluster_config)
    return used


def test_in_a_pod_with_no_kubeconfig_asked_for_the_service_account_is_used(
    in_a_pod: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # a ~/.kube/config there would come after
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(KUBECONFIG)
    connection = client.connect()
    assert in_a_pod == ["in-cluster"]
    assert connection.host == "https://198.51.100.1:443"


def test_a_kubeconfig_asked_for_wins_even_in_a_pod(
    in_a_pod: list[str], kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    connection = client.connect()
    assert in_a_pod == []
    assert (connection.host, connection.namespace) == ("https://192.0.2.10:6443", "reports")
    # Named in audit logs and API priority rules as itself, not as the generated client.
    assert connection.api.user_agent.startswith("cronlock-operator/")
    monkeypatch.delenv("KUBECONFIG")
    assert client.connect(kubeconfig).host == "https://192.0.2.10:6443"
    assert in_a_pod == []


def test_outside_a_pod_without_any_configuration_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(errors.NoConfiguration, match="set KUBECONFIG or --kubeconfig"):
        client.connect()


def test_a_kubeconfig_that_is_missing_or_not_one_is_the_users_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(errors.KubeConfigError, match="no such file"):
        client.connect(str(tmp_path / "absent"))
    broken = tmp_path / "broken"
    broken.write_text("- a list\n- where a map belongs\n")
    with pytest.raises(errors.KubeConfigError, match="cannot be read"):
        client.connect(str(broken))
