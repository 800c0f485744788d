"""Where the API server is and how to prove who we are, without the heavy kubernetes package."""

from __future__ import annotations

import base64
import binascii
import json
import os
import ssl
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeConfigError(Exception):
    """A configuration that can never work: a user must fix it (exit 78)."""


class TokenFile:
    """A bearer token read from a file again whenever the file changes (tokens rotate)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def __call__(self) -> str:
        with self._lock:
            stat = self.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if stamp != self._stamp:
                self._token = self.path.read_text(encoding="utf-8").strip()
                self._stamp = stamp
            return self._token


class Cluster:
    """One API server endpoint with its TLS settings and credentials."""

    # A plain class, not a dataclass: importing dataclasses slows a short run's start-up.
    # Constructor order, not sorted: repr and equality go through the slots in this order.
    __slots__ = (  # noqa: RUF023
        "server",
        "ssl_context",
        "token",
        "token_file",
        "namespace",
        "source",
        "tls_server_name",
        "credential",
        "proxy",
    )
    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext | None,
        token: str = "",
        token_file: TokenFile | None = None,
        namespace: str = "",
        source: str = "",
        tls_server_name: str = "",
        credential: ExecCredential | None = None,
        proxy: str = "",
    ) -> None:
        self.server = server
        self.proxy = proxy
        self.tls_server_name = tls_server_name
        self.credential = credential
        self.ssl_context = ssl_context
        self.token = token
        self.token_file = token_file
        self.namespace = namespace
        self.source = source

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Cluster) and other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{self.__class__.__qualname__}({fields})"

    @property
    def host(self) -> str:
        return urlsplit(self.server).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.server)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def scheme(self) -> str:
        return urlsplit(self.server).scheme

    @property
    def base_path(self) -> str:
        return urlsplit(self.server).path.rstrip("/")

    def bearer_token(self) -> str:
        if self.credential is not None:
            return self.credential()
        if self.token_file is not None:
            return self.token_file()
        return self.token


def load_cluster(env: Mapping[str, str]) -> Cluster:
    """kubectl's order: $KUBECONFIG, then ~/.kube/config, then the pod's service account;
    then the proxy, as client-go picks it: the cluster's proxy-url, else HTTPS_PROXY (or
    HTTP_PROXY for an http:// server) unless NO_PROXY names the host."""
    cluster = _load_cluster(env)
    if not cluster.proxy:
        cluster.proxy = proxy_from_env(env, cluster.scheme, cluster.host)
    return cluster


def proxy_from_env(env: Mapping[str, str], scheme: str, host: str) -> str:
    names = ("HTTPS_PROXY", "https_proxy") if scheme == "https" else ("HTTP_PROXY", "http_proxy")
    proxy = next((env[name] for name in names if env.get(name)), "")
    if not proxy:
        return ""
    no_proxy = env.get("NO_PROXY") or env.get("no_proxy") or ""
    for entry in (part.strip().lower() for part in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*" or host.lower() == entry or host.lower().endswith("." + entry.lstrip(".")):
            return ""
        if "/" in entry and _in_network(host, entry):
            return ""
    return proxy


def _in_network(host: str, network: str) -> bool:
    import ipaddress  # only for a NO_PROXY with a CIDR: off everyone else's start-up

    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(network, strict=False)
    except ValueError:
        return False


def _load_cluster(env: Mapping[str, str]) -> Cluster:
    kubeconfig = env.get("KUBECONFIG", "")
    if kubeconfig:
        paths = [Path(part) for part in kubeconfig.split(os.pathsep) if part]
        existing = [path for path in paths if path.is_file()]
        if not existing:
            raise KubeConfigError(f"KUBECONFIG={kubeconfig}: no such file")
        return from_kubeconfig(existing)
    home = env.get("HOME") or str(Path.home())
    default = Path(home) / ".kube" / "config"
    if default.is_file():
        return from_kubeconfig([default])
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(env)
    raise KubeConfigError(
        "no Kubernetes configuration: set KUBECONFIG, create ~/.kube/config, or run in a pod"
    )


def in_cluster(env: Mapping[str, str], account_dir: Path = SERVICE_ACCOUNT_DIR) -> Cluster:
    """The API server of the pod's own cluster, with the mounted token and CA bundle."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    token_path = account_dir / "token"
    ca_path = account_dir / "ca.crt"
    if not token_path.is_file():
        raise KubeConfigError(f"in-cluster: no service account token at {token_path}")
    if not ca_path.is_file():
        raise KubeConfigError(f"in-cluster: no CA bundle at {ca_path}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(ca_path))
    except (OSError, ssl.SSLError) as error:
        raise KubeConfigError(f"in-cluster: CA bundle {ca_path}: {error}") from error
    bracketed = f"[{host}]" if ":" in host else host
    namespace_path = account_dir / "namespace"
    namespace = (
        namespace_path.read_text(encoding="utf-8").strip() if namespace_path.is_file() else ""
    )
    return Cluster(
        server=f"https://{bracketed}:{port}",
        ssl_context=context,
        token_file=TokenFile(token_path),
        namespace=namespace,
        source="in-cluster service account",
    )


def _named(config: Mapping[str, Any], section: str, key: str) -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for entry in config.get(section) or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            body = entry.get(key)
            entries.setdefault(entry["name"], body if isinstance(body, dict) else {})
    return entries


def from_kubeconfig(paths: list[Path]) -> Cluster:
    """The current context of one or more kubeconfig files merged as kubectl merges them."""
    clusters: dict[str, tuple[dict[str, Any], Path]] = {}
    users: dict[str, tuple[dict[str, Any], Path]] = {}
    contexts: dict[str, dict[str, Any]] = {}
    current = ""
    for path in paths:
        loaded = _load_document(path)
        if not isinstance(loaded, dict):
            raise KubeConfigError(f"kubeconfig {path}: not a kubeconfig mapping")
        for name, body in _named(loaded, "clusters", "cluster").items():
            clusters.setdefault(name, (body, path.parent))
        for name, body in _named(loaded, "users", "user").items():
            users.setdefault(name, (body, path.parent))
        for name, body in _named(loaded, "contexts", "context").items():
            contexts.setdefault(name, body)
        current = current or str(loaded.get("current-context") or "")
    where = ", ".join(str(path) for path in paths)
    if not current:
        raise KubeConfigError(f"kubeconfig {where}: no current-context")
    if current not in contexts:
        raise KubeConfigError(f"kubeconfig {where}: context {current!r} not found")
    context = contexts[current]
    cluster_name = str(context.get("cluster") or "")
    if cluster_name not in clusters:
        raise KubeConfigError(f"kubeconfig {where}: cluster {cluster_name!r} not found")
    cluster, cluster_dir = clusters[cluster_name]
    user_name = str(context.get("user") or "")
    user, user_dir = users.get(user_name, ({}, cluster_dir))
    server = str(cluster.get("server") or "")
    scheme = urlsplit(server).scheme
    if scheme not in {"http", "https"} or not urlsplit(server).hostname:
        raise KubeConfigError(
            f"kubeconfig {where}: cluster {cluster_name!r}: bad server {server!r}"
        )
    credential = None
    token = str(user.get("token") or "")
    if "exec" in user:
        credential = ExecCredential(
            user["exec"], user_dir, f"kubeconfig {where}: user {user_name!r}"
        )
    elif "auth-provider" in user:
        token = _auth_provider_token(
            user["auth-provider"], f"kubeconfig {where}: user {user_name!r}"
        )
    insecure = _insecure_skip_tls_verify(cluster, f"kubeconfig {where}: cluster {cluster_name!r}")
    context_ssl = (
        _ssl_context(cluster, cluster_dir, user, user_dir, insecure=insecure)
        if scheme == "https"
        else None
    )
    token_file = user.get("tokenFile")
    return Cluster(
        server=server,
        ssl_context=context_ssl,
        token=token,
        token_file=TokenFile(_resolve(str(token_file), user_dir)) if token_file else None,
        namespace=str(context.get("namespace") or ""),
        source=f"kubeconfig {where} (context {current})",
        tls_server_name=str(cluster.get("tls-server-name") or ""),
        credential=credential,
        proxy=str(cluster.get("proxy-url") or ""),
    )


class ExecCredential:
    """A token from a kubeconfig `exec` plugin (EKS, GKE, OIDC helpers), run as kubectl
    runs it: with its args and env and KUBERNETES_EXEC_INFO, its ExecCredential read from
    stdout, and run again once the token's expirationTimestamp has passed."""

    def __init__(self, spec: object, base: Path, where: str) -> None:
        if not isinstance(spec, dict) or not spec.get("command"):
            raise KubeConfigError(f"{where}: exec has no command")
        self.where = where
        command = str(spec["command"])
        # kubectl resolves a relative command with a slash against the kubeconfig's dir.
        if "/" in command and not Path(command).is_absolute():
            command = str(base / command)
        self.argv = [command, *(str(arg) for arg in spec.get("args") or [])]
        self.env = {
            str(item.get("name")): str(item.get("value"))
            for item in spec.get("env") or []
            if isinstance(item, dict) and item.get("name")
        }
        self.api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
        self._lock = threading.Lock()
        self._token = ""
        self._expires: float | None = None

    def __call__(self) -> str:
        with self._lock:
            if not self._token or (self._expires is not None and time.time() >= self._expires):
                self._token, self._expires = self._run()
            return self._token

    def _run(self) -> tuple[str, float | None]:
        import subprocess  # only for exec kubeconfigs: off the start-up path of the others

        info = {
            "apiVersion": self.api_version,
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            done = subprocess.run(
                self.argv,
                env=env,
                capture_output=True,
                text=True,
                errors="replace",  # a plugin printing non-UTF-8 gets a message, not a traceback
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise OSError(f"{self.where}: exec plugin {self.argv[0]}: {error}") from error
        if done.returncode != 0:
            raise OSError(
                f"{self.where}: exec plugin {self.argv[0]} exited {done.returncode}: "
                + done.stderr.strip()[-300:]
            )
        # Whatever the plugin printed, a bad credential is an OSError: the caller's
        # "cannot get a token" (exit 69), never a traceback.
        try:
            credential = json.loads(done.stdout)
        except ValueError as error:
            raise OSError(f"{self.where}: exec plugin printed no ExecCredential") from error
        if not isinstance(credential, dict):
            raise OSError(f"{self.where}: exec plugin printed no ExecCredential")
        status = credential.get("status") or {}
        if not isinstance(status, dict):
            raise OSError(f"{self.where}: exec plugin's ExecCredential status is not an object")
        token = status.get("token")
        if not isinstance(token, str) or not token:
            raise OSError(
                f"{self.where}: exec plugin gave no token (client certificates from a plugin "
                "are not supported)"
            )
        return token, self._expiry(status.get("expirationTimestamp"))

    def _expiry(self, expires: object) -> float | None:
        """expirationTimestamp as a Unix time; None (never expires) when absent, as kubectl."""
        if expires is None or expires == "":
            return None
        from datetime import datetime

        problem = f"{self.where}: exec plugin's expirationTimestamp {str(expires)[:40]!r}"
        if not isinstance(expires, str):
            raise OSError(f"{problem} is not an RFC 3339 time")
        try:
            moment = datetime.fromisoformat(expires.replace("Z", "+00:00"))
        except ValueError as error:
            raise OSError(f"{problem} is not an RFC 3339 time") from error
        if moment.tzinfo is None:  # RFC 3339 has an offset: which zone is meant is unknown
            raise OSError(f"{problem} has no time zone offset")
        return moment.timestamp()


def _auth_provider_token(provider: object, where: str) -> str:
    """The id-token of an `oidc` auth-provider (as kubectl sends it); others are refused."""
    name = provider.get("name") if isinstance(provider, dict) else None
    config = provider.get("config") if isinstance(provider, dict) else None
    if name == "oidc" and isinstance(config, dict) and config.get("id-token"):
        return str(config["id-token"])
    raise KubeConfigError(
        f"{where}: auth-provider {name!r} is not supported (only oidc with an id-token); "
        "use an exec plugin, a token, a tokenFile or a client certificate"
    )


def _resolve(path: str, base: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def _decode(value: object, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as error:
        raise KubeConfigError(f"kubeconfig: {what} is not base64: {error}") from error


def _insecure_skip_tls_verify(cluster: Mapping[str, Any], where: str) -> bool:
    """The cluster's insecure-skip-tls-verify, refused where kubectl refuses the file."""
    value = cluster.get("insecure-skip-tls-verify")
    if value is None:
        return False
    # Truthiness would read the string "false" as true and turn verification off.
    if not isinstance(value, bool):
        raise KubeConfigError(
            f"{where}: insecure-skip-tls-verify must be true or false, not {value!r}"
        )
    if value and (
        cluster.get("certificate-authority") or cluster.get("certificate-authority-data")
    ):
        raise KubeConfigError(
            f"{where}: specifying a root certificates file with the insecure flag is not allowed"
            " (remove insecure-skip-tls-verify, or the certificate-authority)"
        )
    return value


def _ssl_context(
    cluster: Mapping[str, Any],
    cluster_dir: Path,
    user: Mapping[str, Any],
    user_dir: Path,
    *,
    insecure: bool,
) -> ssl.SSLContext:
    # The system trust store is loaded only when no CA is named: it costs megabytes.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif cluster.get("certificate-authority-data"):
            pem = _decode(cluster["certificate-authority-data"], "certificate-authority-data")
            context.load_verify_locations(cadata=pem.decode("ascii"))
        elif cluster.get("certificate-authority"):
            ca_path = _resolve(str(cluster["certificate-authority"]), cluster_dir)
            context.load_verify_locations(cafile=str(ca_path))
        else:
            context.load_default_certs()
        _load_client_certificate(context, user, user_dir)
    except (OSError, ssl.SSLError, UnicodeDecodeError) as error:
        raise KubeConfigError(f"kubeconfig: TLS material: {error}") from error
    return context


def _load_client_certificate(
    context: ssl.SSLContext, user: Mapping[str, Any], user_dir: Path
) -> None:
    has_cert = user.get("client-certificate-data") or user.get("client-certificate")
    has_key = user.get("client-key-data") or user.get("client-key")
    if not has_cert and not has_key:
        return
    if not has_cert or not has_key:
        raise KubeConfigError("kubeconfig: a client certificate needs both a certificate and a key")
    cert = (
        _decode(user["client-certificate-data"], "client-certificate-data")
        if user.get("client-certificate-data")
        else _resolve(str(user["client-certificate"]), user_dir).read_bytes()
    )
    key = (
        _decode(user["client-key-data"], "client-key-data")
        if user.get("client-key-data")
        else _resolve(str(user["client-key"]), user_dir).read_bytes()
    )
    # ssl only loads key material from a file: a private one that lives for this call alone.
    import tempfile  # here, not at the top: only inline key data needs it (slow to import)

    descriptor, name = tempfile.mkstemp(prefix="cronlock-client-", suffix=".pem")
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(cert.rstrip(b"\n") + b"\n" + key)
        context.load_cert_chain(name)
    finally:
        os.unlink(name)


def _load_document(path: Path) -> Any:
    """JSON without importing yaml (a third of a short run's start-up); YAML otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise KubeConfigError(f"kubeconfig {path}: {error}") from error
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML flow mappings start with "{" too; the YAML parser decides
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise KubeConfigError(f"kubeconfig {path}: {error}") from error
