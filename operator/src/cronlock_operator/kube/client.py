"""The one way the operator's commands find their API server and build an ApiClient.

One precedence for every command (the operator, `uninstall`, `selfcheck`, `cronlock
status`), controller-runtime's: a kubeconfig named on the command line, else the one
`KUBECONFIG` names, else the pod's ServiceAccount when running in a pod, else
`~/.kube/config`. In a pod nothing sets a kubeconfig, so the operator uses its
ServiceAccount; on a laptop `cronlock status` uses the user's kubeconfig, as kubectl does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Final

import kubernetes
import yaml

from cronlock_operator.kube.errors import KubeConfigError, NoConfiguration

# Who cronlock is to the API server: the field manager of every write (so managedFields,
# and GitOps tools reading them, tell cronlock's fields from the user's) and the
# User-Agent of every request (so audit logs and API priority rules can name it).
FIELD_MANAGER: Final = "cronlock"
USER_AGENT: Final = "cronlock-operator"

_SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Connection:
    api: kubernetes.client.ApiClient
    namespace: str  # the context's namespace, or the pod's; "default" when neither says
    host: str


def connect(
    kubeconfig: str | None = None, context: str | None = None, pool_size: int | None = None
) -> Connection:
    """An ApiClient by the precedence above; `pool_size` pooled connections when given (the
    client's default is fewer than the operator's threads)."""
    configuration = kubernetes.client.Configuration()
    asked = kubeconfig is not None or context is not None or bool(os.environ.get("KUBECONFIG"))
    if asked or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        namespace = _load_kubeconfig(configuration, kubeconfig, context, asked)
    else:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException as error:
            raise NoConfiguration(f"in-cluster configuration: {error}") from error
        namespace = _in_cluster_namespace()
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    api = kubernetes.client.ApiClient(configuration)
    api.user_agent = f"{USER_AGENT}/{version()}"
    return Connection(api, namespace, configuration.host)


def version() -> str:
    """The installed cronlock's version ("unknown" from a checkout not installed)."""
    try:
        return metadata.version("cronlock")
    except metadata.PackageNotFoundError:
        return "unknown"


def api_client(pool_size: int | None = None) -> kubernetes.client.ApiClient:
    """`connect()`'s ApiClient, for the operator's commands (no flags of their own)."""
    return connect(pool_size=pool_size).api


def _load_kubeconfig(
    configuration: Any, kubeconfig: str | None, context: str | None, asked: bool
) -> str:
    if kubeconfig is not None and not Path(kubeconfig).expanduser().is_file():
        raise KubeConfigError(f"--kubeconfig {kubeconfig}: no such file")
    # $KUBECONFIG as it is now (the client reads it once, when imported); a `:` list merges.
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        kubernetes.config.load_kube_config(
            config_file=path,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=path)
    except kubernetes.config.ConfigException as error:
        if asked:
            raise KubeConfigError(f"kubeconfig: {error}") from error
        raise NoConfiguration(
            f"no Kubernetes configuration: {error} (set KUBECONFIG or --kubeconfig)"
        ) from error
    except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError, OSError) as error:
        # A kubeconfig that is there but not one (bad YAML, a list where a map belongs).
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise KubeConfigError(f"kubeconfig {where} cannot be read: {error}") from error
    chosen = next((entry for entry in contexts if entry["name"] == context), active)
    return str((chosen.get("context") or {}).get("namespace") or "default")


def _in_cluster_namespace() -> str:
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"
