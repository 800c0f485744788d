"""Finding and authenticating to the API server like kubectl does, without the kubernetes client."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from cronlock_sidecar.cli import main
from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
from cronlock_sidecar.transport.kubeconfig import (
    KubeConfigError,
    TokenFile,
    in_cluster,
    load_cluster,
)
from cronlock_sidecar.transport.seam import Unavailable

if TYPE_CHECKING:
    from tests.unit.sidecar.fakes import FakeApiServer

from tests.support.leases import make_lease
from tests.unit.sidecar.fakes import LEASE


def write_kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [
                    {"name": "test", "context": {"cluster": "c", "user": "u", "namespace": "ops"}}
                ],
            }
        )
    )
    return path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    root = tmp_path_factory.mktemp("pki")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req",
        "-x509",
        *key,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
    )
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", "/O=system:masters/CN=admin")):
        openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile", "san.ext",
        )  # fmt: skip
    # A server certificate for a name only (no IP): reachable at 127.0.0.1 only with
    # tls-server-name.
    (root / "named.ext").write_text("subjectAltName=DNS:api.cluster.internal\n")
    openssl("req", *key, "-keyout", "named.key", "-out", "named.csr", "-subj", "/CN=api")
    openssl(
        "x509", "-req", "-in", "named.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "named.crt", "-days", "1", "-extfile", "named.ext",
    )  # fmt: skip
    return root


@pytest.fixture
def tls_api_server(api_server: FakeApiServer, pki: Path) -> FakeApiServer:
    """The fake API server behind TLS that demands a client certificate from our CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    context.load_verify_locations(pki / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    api_server.httpd.socket = context.wrap_socket(api_server.httpd.socket, server_side=True)
    api_server.url = api_server.url.replace("http://", "https://")
    api_server.put_lease(make_lease(transitions=1))
    return api_server


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_inline_ca_and_client_certificate_reach_a_tls_api_server(
    tls_api_server: FakeApiServer, pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_dir = tmp_path / "tmp"
    key_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(key_dir))
    kubeconfig = write_kubeconfig(
        tmp_path / "config",
        {"server": tls_api_server.url, "certificate-authority-data": b64(pki / "ca.crt")},
        {
            "client-certificate-data": b64(pki / "client.crt"),
            "client-key-data": b64(pki / "client.key"),
        },
    )
    cluster = load_cluster({"KUBECONFIG": str(kubeconfig)})
    assert cluster.namespace == "ops"
    assert list(key_dir.iterdir()) == []  # the key was written to a private file and removed
    with KubeLeaseClient(cluster) as client:
        lease = client.get(LEASE)
    assert lease["spec"]["leaseTransitions"] == 1


def test_certificate_files_resolve_relative_to_the_kubeconfig(
    tls_api_server: FakeApiServer, pki: Path
) -> None:
    kubeconfig = write_kubeconfig(
        pki / "relative-config",
        {"server": tls_api_server.url, "certificate-authority": "ca.crt"},
        {"client-certificate": "client.crt", "client-key": "client.key"},
    )
    cluster = load_cluster({"KUBECONFIG": str(kubeconfig)})
    with KubeLeaseClient(cluster) as client:
        assert client.get(LEASE)["kind"] == "Lease"


def test_a_server_certificate_from_another_ca_is_refused_with_exit_69(
    tls_api_server: FakeApiServer, pki: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "config",
        {"server": tls_api_server.url},
        {"client-certificate": str(pki / "client.crt"), "client-key": str(pki / "client.key")},
    )
    code = main(
        ["run", "--lease", "default/cronlock-report", "--", "true"], {"KUBECONFIG": str(kubeconfig)}
    )
    assert code == 69
    assert "unavailable: cannot get lease default/cronlock-report" in capsys.readouterr().err


def test_insecure_skip_tls_verify_is_honoured(
    tls_api_server: FakeApiServer, pki: Path, tmp_path: Path
) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "config",
        {"server": tls_api_server.url, "insecure-skip-tls-verify": True},
        {"client-certificate": str(pki / "client.crt"), "client-key": str(pki / "client.key")},
    )
    cluster = load_cluster({"KUBECONFIG": str(kubeconfig)})
    with KubeLeaseClient(cluster) as client:
        assert client.get(LEASE)["kind"] == "Lease"


def test_token_is_sent_as_a_bearer_token(api_server: FakeApiServer) -> None:
    api_server.put_lease(make_lease())
    cluster = load_cluster({"KUBECONFIG": str(api_server.kubeconfig)})
    with KubeLeaseClient(cluster) as client:
        client.get(LEASE)
    assert api_server.tokens_seen == ["Bearer fake-token"]


def test_token_file_is_read_again_when_it_rotates(
    api_server: FakeApiServer, tmp_path: Path
) -> None:
    api_server.put_lease(make_lease())
    token = tmp_path / "token"
    token.write_text("first\n")
    kubeconfig = write_kubeconfig(
        tmp_path / "config", {"server": api_server.url}, {"tokenFile": "token"}
    )
    with KubeLeaseClient(load_cluster({"KUBECONFIG": str(kubeconfig)})) as client:
        client.get(LEASE)
        token.write_text("second-and-longer\n")
        client.get(LEASE)
    assert api_server.tokens_seen == ["Bearer first", "Bearer second-and-longer"]


def test_in_cluster_uses_the_service_account_and_rereads_a_rotated_token(tmp_path: Path) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("token-1")
    (account / "namespace").write_text("jobs\n")
    pki_ca = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(tmp_path / "k"), "-out", str(account / "ca.crt"), "-days", "1",
         "-subj", "/CN=ca"],
        capture_output=True, check=False,
    )  # fmt: skip
    assert pki_ca.returncode == 0
    cluster = in_cluster(
        {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, account
    )
    assert cluster.server == "https://10.96.0.1:443"
    assert cluster.namespace == "jobs"
    assert cluster.bearer_token() == "token-1"
    (account / "token").write_text("token-2-rotated")
    assert cluster.bearer_token() == "token-2-rotated"


def test_token_file_keeps_its_value_while_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc")
    source = TokenFile(path)
    assert source() == "abc"
    stamp = os.stat(path)
    path.write_text("xyz")
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert source() in {"abc", "xyz"}  # same size and mtime: may be cached, never an error


def plugin(tmp_path: Path, body: str) -> Path:
    """An exec credential plugin: a shell script that counts its runs in `runs`."""
    script = tmp_path / "plugin"
    script.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'runs'}\n{body}\n")
    script.chmod(0o755)
    return script


def exec_user(script: Path, **extra: Any) -> dict[str, Any]:
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(script),
            "args": ["token", "--cluster", "test"],
            "env": [{"name": "PLUGIN_REGION", "value": "eu-1"}],
            **extra,
        }
    }


def test_an_exec_plugins_token_is_used_and_fetched_again_once_it_expires(
    api_server: FakeApiServer, tmp_path: Path
) -> None:
    api_server.put_lease(make_lease())
    expires = tmp_path / "expires"
    expires.write_text("2000-01-01T00:00:00Z")  # already expired: fetched for each request
    script = plugin(
        tmp_path,
        # What kubectl gives a plugin: its args, its env, and KUBERNETES_EXEC_INFO.
        'test "$1 $2 $3" = "token --cluster test" || exit 3\n'
        'test "$PLUGIN_REGION" = eu-1 || exit 4\n'
        'echo "$KUBERNETES_EXEC_INFO" | grep -q \'"interactive": false\' || exit 5\n'
        "n=$(wc -l < " + str(tmp_path / "runs") + ")\n"
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        '"status":{"token":"plugin-%s","expirationTimestamp":"%s"}}\' "$n" "$(cat '
        + str(expires)
        + ')"',
    )
    kubeconfig = write_kubeconfig(
        tmp_path / "config", {"server": api_server.url}, exec_user(script)
    )
    with KubeLeaseClient(load_cluster({"KUBECONFIG": str(kubeconfig)})) as client:
        client.get(LEASE)
        client.get(LEASE)
        expires.write_text("2099-01-01T00:00:00Z")  # from now on valid: kept
        client.get(LEASE)
        client.get(LEASE)
    assert api_server.tokens_seen == [
        "Bearer plugin-1",
        "Bearer plugin-2",
        "Bearer plugin-3",
        "Bearer plugin-3",
    ]


def test_a_failing_exec_plugin_fails_the_run_closed_with_exit_69_naming_it(
    api_server: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = plugin(tmp_path, "echo 'token expired, run aws sso login' >&2; exit 1")
    kubeconfig = write_kubeconfig(
        tmp_path / "config", {"server": api_server.url}, exec_user(script)
    )
    code = main(["run", "--lease", "default/x", "--", "true"], {"KUBECONFIG": str(kubeconfig)})
    assert code == 69
    err = capsys.readouterr().err
    assert f"exec plugin {script} exited 1: token expired, run aws sso login" in err


def test_an_oidc_auth_provider_sends_its_id_token_and_others_are_refused_with_exit_78(
    api_server: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api_server.put_lease(make_lease())
    oidc = {
        "auth-provider": {"name": "oidc", "config": {"id-token": "eyJ-id", "idp-issuer-url": "x"}}
    }
    kubeconfig = write_kubeconfig(tmp_path / "config", {"server": api_server.url}, oidc)
    with KubeLeaseClient(load_cluster({"KUBECONFIG": str(kubeconfig)})) as client:
        client.get(LEASE)
    assert api_server.tokens_seen == ["Bearer eyJ-id"]

    gcp = {"auth-provider": {"name": "gcp", "config": {}}}
    kubeconfig = write_kubeconfig(tmp_path / "config2", {"server": api_server.url}, gcp)
    code = main(["run", "--lease", "default/x", "--", "true"], {"KUBECONFIG": str(kubeconfig)})
    assert code == 78
    assert "auth-provider 'gcp' is not supported (only oidc with an id-token)" in (
        capsys.readouterr().err
    )


def test_tls_server_name_is_the_name_the_certificate_is_checked_against(
    api_server: FakeApiServer, pki: Path, tmp_path: Path
) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "named.crt", pki / "named.key")
    api_server.httpd.socket = context.wrap_socket(api_server.httpd.socket, server_side=True)
    api_server.put_lease(make_lease())
    url = api_server.url.replace("http://", "https://")
    cluster = {"server": url, "certificate-authority": str(pki / "ca.crt")}
    plain = write_kubeconfig(tmp_path / "plain", cluster, {"token": "t"})
    with (
        KubeLeaseClient(load_cluster({"KUBECONFIG": str(plain)})) as client,
        pytest.raises(Unavailable, match=r"certificate verify failed|IP address mismatch"),
    ):
        client.get(LEASE)
    named = write_kubeconfig(
        tmp_path / "named", {**cluster, "tls-server-name": "api.cluster.internal"}, {"token": "t"}
    )
    with KubeLeaseClient(load_cluster({"KUBECONFIG": str(named)})) as client:
        assert client.get(LEASE)["kind"] == "Lease"


def test_429_is_retried_after_the_servers_retry_after_within_the_request_budget(
    api_server: FakeApiServer,
) -> None:
    import time

    api_server.put_lease(make_lease())
    api_server.throttle = [1, 1]
    cluster = load_cluster({"KUBECONFIG": str(api_server.kubeconfig)})
    with KubeLeaseClient(cluster) as client:
        started = time.monotonic()
        assert client.get(LEASE)["kind"] == "Lease"
        assert time.monotonic() - started >= 2
        # Told to wait longer than the request may take: the 429 is the answer.
        api_server.throttle = [60]
        with pytest.raises(Unavailable, match="HTTP 429"):
            client.get(LEASE, timeout=2)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("apiVersion: v1\nkind: Config\n", "no current-context"),
        ("current-context: nope\ncontexts: []\n", "context 'nope' not found"),
        ("[not, a, mapping]", "not a kubeconfig mapping"),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: x, user: u}}]\n",
            "cluster 'x' not found",
        ),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: x}}]\n"
            "clusters: [{name: x, cluster: {server: 'ftp://h'}}]\n",
            "bad server 'ftp://h'",
        ),
    ],
)
def test_broken_kubeconfigs_name_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(content)
    with pytest.raises(KubeConfigError, match=message):
        load_cluster({"KUBECONFIG": str(path)})


def test_no_configuration_at_all_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="set KUBECONFIG"):
        load_cluster({"HOME": str(tmp_path)})
    with pytest.raises(KubeConfigError, match="no such file"):
        load_cluster({"KUBECONFIG": str(tmp_path / "missing")})


def test_server_errors_become_typed_errors(api_server: FakeApiServer) -> None:
    api_server.broken = True
    client = KubeLeaseClient(load_cluster({"KUBECONFIG": str(api_server.kubeconfig)}))
    with (
        client,
        pytest.raises(
            Unavailable, match=r"cannot get lease default/cronlock-report: HTTP 503: etcd is down"
        ),
    ):
        client.get(LEASE)


class ConnectProxy:
    """An HTTP CONNECT proxy: records each tunnel's target and Proxy-Authorization, relays."""

    def __init__(self) -> None:
        import socket
        import threading

        self.tunnels: list[tuple[str, str]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                head += client.recv(4096)
            lines = head.decode().split("\r\n")
            target = lines[0].split()[1]
            auth = next(
                (
                    line.split(": ", 1)[1]
                    for line in lines
                    if line.startswith("Proxy-Authorization")
                ),
                "",
            )
            self.tunnels.append((target, auth))
            host, port = target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    @staticmethod
    def _relay(source: Any, sink: Any) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            sink.close()

    def close(self) -> None:
        self.listener.close()


def test_https_proxy_and_proxy_url_tunnel_with_connect_and_no_proxy_bypasses(
    tls_api_server: FakeApiServer, pki: Path, tmp_path: Path
) -> None:
    proxy = ConnectProxy()
    try:
        cluster = {"server": tls_api_server.url, "certificate-authority": str(pki / "ca.crt")}
        user = {
            "client-certificate": str(pki / "client.crt"),
            "client-key": str(pki / "client.key"),
        }
        kubeconfig = write_kubeconfig(tmp_path / "config", cluster, user)
        port = tls_api_server.url.rsplit(":", 1)[1]
        env = {
            "KUBECONFIG": str(kubeconfig),
            "HTTPS_PROXY": proxy.url.replace("//", "//ops:s%3Acret@"),
        }
        with KubeLeaseClient(load_cluster(env)) as client:
            assert client.get(LEASE)["kind"] == "Lease"  # TLS end to end, through the tunnel
        assert proxy.tunnels == [
            (f"127.0.0.1:{port}", "Basic " + base64.b64encode(b"ops:s:cret").decode())
        ]
        # NO_PROXY (a CIDR here) goes direct; the kubeconfig's proxy-url wins over the env.
        with KubeLeaseClient(
            load_cluster({**env, "NO_PROXY": "example.com,127.0.0.0/8"})
        ) as client:
            client.get(LEASE)
        assert len(proxy.tunnels) == 1
        with_url = write_kubeconfig(
            tmp_path / "with-url", {**cluster, "proxy-url": proxy.url}, user
        )
        with KubeLeaseClient(load_cluster({"KUBECONFIG": str(with_url)})) as client:
            client.get(LEASE)
        assert [target for target, _ in proxy.tunnels] == [f"127.0.0.1:{port}"] * 2
    finally:
        proxy.close()


def test_a_proxy_that_refuses_the_tunnel_fails_closed_naming_it(
    api_server: FakeApiServer, tmp_path: Path
) -> None:
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def refuse() -> None:
        client, _ = listener.accept()
        client.recv(4096)
        client.sendall(b"HTTP/1.1 403 Forbidden\r\n\r\n")
        client.close()

    threading.Thread(target=refuse, daemon=True).start()
    env = {
        "KUBECONFIG": str(api_server.kubeconfig),
        "HTTP_PROXY": f"http://127.0.0.1:{listener.getsockname()[1]}",
    }
    with (
        KubeLeaseClient(load_cluster(env)) as client,
        pytest.raises(Unavailable, match="refused CONNECT"),
    ):
        client.get(LEASE)
    listener.close()


@pytest.mark.parametrize(
    ("proxy", "named"),
    [
        ("https://alice:s3cr3t@127.0.0.1:3128", "proxy https://127.0.0.1:3128: only http://"),
        ("socks5://alice:s3cr3t@[::1]:1080", "proxy socks5://[::1]:1080: only http://"),
        ("http://alice:s3cr3t@127.0.0.1:port", "proxy: not a URL of the form http://host:port"),
        ("alice:s3cr3t@127.0.0.1:3128", "proxy: not a URL of the form http://host:port"),
    ],
)
def test_a_proxy_that_cannot_be_used_is_named_without_its_credentials(
    api_server: FakeApiServer, proxy: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"KUBECONFIG": str(api_server.kubeconfig), "HTTP_PROXY": proxy}
    code = main(["run", "--lease", "default/x", "--", "true"], env)
    assert code == 69
    err = capsys.readouterr().err
    assert named in err
    assert "s3cr3t" not in err
    assert "alice" not in err


@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1])
def test_insecure_skip_tls_verify_that_is_not_a_boolean_is_refused_with_exit_78(
    tmp_path: Path, value: object, capsys: pytest.CaptureFixture[str]
) -> None:
    # kubectl refuses such a file; reading "false" as true would turn verification off.
    kubeconfig = write_kubeconfig(
        tmp_path / "config",
        {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": value},
        {"token": "t"},
    )
    with pytest.raises(KubeConfigError, match="insecure-skip-tls-verify must be true or false"):
        load_cluster({"KUBECONFIG": str(kubeconfig)})
    code = main(["run", "--lease", "default/x", "--", "true"], {"KUBECONFIG": str(kubeconfig)})
    assert code == 78
    assert f"cluster 'c': insecure-skip-tls-verify must be true or false, not {value!r}" in (
        capsys.readouterr().err
    )


def test_insecure_skip_tls_verify_false_keeps_verifying(
    tls_api_server: FakeApiServer, pki: Path, tmp_path: Path
) -> None:
    user = {"client-certificate": str(pki / "client.crt"), "client-key": str(pki / "client.key")}
    # No CA named: the system store, which does not trust the test CA, decides.
    kubeconfig = write_kubeconfig(
        tmp_path / "config", {"server": tls_api_server.url, "insecure-skip-tls-verify": False}, user
    )
    with (
        KubeLeaseClient(load_cluster({"KUBECONFIG": str(kubeconfig)})) as client,
        pytest.raises(Unavailable, match="certificate verify failed"),
    ):
        client.get(LEASE)
    with_ca = write_kubeconfig(
        tmp_path / "with-ca",
        {
            "server": tls_api_server.url,
            "insecure-skip-tls-verify": False,
            "certificate-authority": str(pki / "ca.crt"),
        },
        user,
    )
    with KubeLeaseClient(load_cluster({"KUBECONFIG": str(with_ca)})) as client:
        assert client.get(LEASE)["kind"] == "Lease"


@pytest.mark.parametrize(
    "authority",
    [
        {"certificate-authority": "ca.crt"},
        {"certificate-authority-data": base64.b64encode(b"not checked").decode()},
    ],
    ids=["file", "data"],
)
def test_insecure_skip_tls_verify_with_a_ca_is_refused_as_kubectl_refuses_it(
    tmp_path: Path, authority: dict[str, str]
) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "config",
        {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True, **authority},
        {"token": "t"},
    )
    with pytest.raises(
        KubeConfigError,
        match="specifying a root certificates file with the insecure flag is not allowed",
    ):
        load_cluster({"KUBECONFIG": str(kubeconfig)})


@pytest.mark.parametrize(
    ("printed", "message"),
    [
        ('{"kind": "ExecCredential", "status": "ok"}', "ExecCredential status is not an object"),
        ('["not", "an", "object"]', "exec plugin printed no ExecCredential"),
        (
            '{"status": {"token": "t", "expirationTimestamp": "next tuesday"}}',
            "expirationTimestamp 'next tuesday' is not an RFC 3339 time",
        ),
        (
            '{"status": {"token": "t", "expirationTimestamp": 4102444800}}',
            "expirationTimestamp '4102444800' is not an RFC 3339 time",
        ),
        (
            '{"status": {"token": "t", "expirationTimestamp": "2099-01-01T00:00:00"}}',
            "expirationTimestamp '2099-01-01T00:00:00' has no time zone offset",
        ),
    ],
    ids=["status-not-object", "not-object", "bad-time", "number-time", "no-offset"],
)
def test_an_exec_plugins_malformed_credential_fails_the_run_with_exit_69_saying_what(
    api_server: FakeApiServer,
    tmp_path: Path,
    printed: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = plugin(tmp_path, f"cat <<'JSON'\n{printed}\nJSON")
    kubeconfig = write_kubeconfig(
        tmp_path / "config", {"server": api_server.url}, exec_user(script)
    )
    code = main(["run", "--lease", "default/x", "--", "true"], {"KUBECONFIG": str(kubeconfig)})
    assert code == 69
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
