"""The operator's one ApiClient: in a pod its ServiceAccount, else the kubeconfig.

`cronlock status`, a user's command, reads the kubeconfig first, as kubectl does
(`status/api.py`); the operator, which runs in a pod, the other way round.
"""

from __future__ import annotations

import kubernetes


def api_client(pool_size: int | None = None) -> kubernetes.client.ApiClient:
    """In a pod its ServiceAccount, else the kubeconfig (as kopf logs in); `pool_size`
    pooled connections when given (the client's default is fewer than our threads)."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return kubernetes.client.ApiClient(configuration)
