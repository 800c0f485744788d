"""Choosing a lock store: the URL checked before anything connects, its password never shown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cronlock_sidecar.cli import main
from cronlock_sidecar.lock.model import LeaseRecord, is_expired, read_lease
from cronlock_sidecar.options import parse_options
from cronlock_sidecar.stores.frames import to_reader
from cronlock_sidecar.stores.url import StoreUrlError, parse_store_url

SECRET = "pa55-w0rd"  # noqa: S105 - a test value


@pytest.mark.parametrize(
    ("url", "kind", "shown"),
    [
        (f"redis://:{SECRET}@127.0.0.1:6379/0", "redis", "redis://:***@127.0.0.1:6379/0"),
        (
            f"rediss://app:{SECRET}@redis.example:6380",
            "redis",
            "rediss://app:***@redis.example:6380",
        ),
        (
            f"postgresql://cronlock:{SECRET}@db.example/locks?sslmode=verify-full&password={SECRET}",
            "postgres",
            "postgresql://cronlock:***@db.example/locks",
        ),
        ("postgres://db.example:5433/locks", "postgres", "postgres://db.example:5433/locks"),
    ],
)
def test_a_store_url_names_its_store_and_shows_no_password(url: str, kind: str, shown: str) -> None:
    store = parse_store_url(url, "--store")
    assert (store.kind, store.shown, str(store)) == (kind, shown, shown)
    assert SECRET not in repr(store)
    assert store.secret == url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("", "--store: empty"),
        (f"mysql://root:{SECRET}@db/x", "scheme 'mysql' names no lock store"),
        ("redis:///0", "has no host"),
        (f"redis://:{SECRET}@host:99999/0", "has no valid port"),
        (f"redis://:{SECRET}@host/0\nextra", "contains whitespace"),
        (f"redis://:{SECRET}@host/0?replicas=two", "replicas='two' is not a whole number"),
        (f"redis://:{SECRET}@host/0?replicas=17", "from 0 to 16"),
        (f"redis://:{SECRET}@host/0?replicas=-1", "replicas='-1' is not a whole number"),
        (f"postgresql://u:{SECRET}@db/x?replicas=1", "replicas= is for a Redis URL"),
    ],
)
def test_a_bad_store_url_is_refused_without_its_password(url: str, expected: str) -> None:
    with pytest.raises(StoreUrlError) as error:
        parse_store_url(url, "--store")
    assert expected in str(error.value)
    assert SECRET not in str(error.value)


def test_replicas_is_taken_out_of_a_redis_url_before_the_client_sees_it() -> None:
    url = f"redis://:{SECRET}@host:6379/0?ssl_ca_certs=/ca.pem&replicas=2"
    store = parse_store_url(url, "--store")
    assert store.replicas == 2
    assert store.secret == f"redis://:{SECRET}@host:6379/0?ssl_ca_certs=%2Fca.pem"
    assert store.shown == "redis://:***@host:6379/0"
    assert parse_store_url(f"redis://:{SECRET}@host/0", "--store").replicas == 0


def test_the_url_comes_from_a_file_and_must_match_the_kind_asked(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text(f"redis://:{SECRET}@127.0.0.1:6379/0\n")
    env = {"CRONLOCK_STORE_FILE": str(url_file), "CRONLOCK_STORE_KIND": "redis"}
    options = parse_options(["run", "--lease", "ns/x", "--", "true"], env)
    assert options.store is not None
    assert options.store.kind == "redis"
    assert SECRET not in repr(options)


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["--store-kind", "postgres"],
            {"CRONLOCK_STORE": f"redis://:{SECRET}@h:6379"},
            "names a redis store, but --store-kind is postgres",
        ),
        (
            [],
            {"CRONLOCK_STORE_KIND": "redis"},
            "redis asks for a store URL, but neither --store nor --store-file gives one",
        ),
        (["--store-kind", "etcd"], {}, "'etcd' is not one of lease, redis, postgres"),
        (
            ["--store", f"redis://:{SECRET}@h", "--store-file", "/x"],
            {},
            "both set; give the URL one way",
        ),
        (
            ["--store-file", "/nonexistent/url"],
            {},
            "cannot read /nonexistent/url: No such file or directory; is the Secret named by "
            "cronlock.io/store-secret there",
        ),
    ],
)
def test_store_options_that_can_never_work_exit_78(
    argv: list[str], env: dict[str, str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--lease", "ns/x", *argv, "--", "true"], env)
    err = capsys.readouterr().err
    assert code == 78
    assert expected in err
    assert SECRET not in err


def test_a_store_file_too_large_or_not_text_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * (64 * 1024 + 1))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    for path, expected in ((big, "is over 65536 bytes"), (binary, "is not UTF-8 text")):
        code = main(["run", "--lease", "ns/x", "--store-file", str(path), "--", "true"], {})
        assert code == 78, expected


def test_the_store_clock_judges_age_whatever_the_clients_clocks_say() -> None:
    """Writer 40s behind, reader 50s ahead: the reader still sees a renewal 3s old."""
    store_write = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
    writer_clock = store_write - timedelta(seconds=40)
    released = (writer_clock - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    document = {
        "metadata": {"annotations": {"cronlock.io/released-at": released}},
        "spec": {
            "holderIdentity": "a",
            "renewTime": writer_clock.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "acquireTime": (writer_clock - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "leaseDurationSeconds": 6,
        },
    }
    store_now = store_write + timedelta(seconds=3)
    reader_now = store_now + timedelta(seconds=50)
    seen = read_lease(
        to_reader(
            document,
            writer_time=writer_clock,
            written_at=store_write,
            store_now=store_now,
            reader_now=reader_now,
            renewed_at=store_write,
        )
    )
    assert seen.renewed_at == reader_now - timedelta(seconds=3)
    assert seen.acquire_time == reader_now - timedelta(seconds=13)
    assert seen.released_at == reader_now - timedelta(seconds=3 + 60)


def test_a_stored_renewal_is_the_stores_never_the_documents() -> None:
    """A writer dates renewTime a year ahead: the reader sees the store's own renewal time;
    a renewal the store dates after its own now (a hash written by hand) reads as expired."""
    store_write = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
    future = (store_write + timedelta(days=365)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    document = {
        "spec": {"holderIdentity": "mallory", "renewTime": future, "leaseDurationSeconds": 86400}
    }
    store_now = store_write + timedelta(seconds=3)

    def seen(renewed_at: datetime) -> LeaseRecord:
        return read_lease(
            to_reader(
                document,
                writer_time=store_write,
                written_at=store_write,
                store_now=store_now,
                reader_now=store_now,
                renewed_at=renewed_at,
            )
        )

    assert seen(store_write).renewed_at == store_write
    assert not is_expired(seen(store_write), store_now, 1.0)
    assert is_expired(seen(store_write), store_now, 0.5, believed_at_most=2)
    assert is_expired(seen(store_now + timedelta(days=365)), store_now, 1.0)
