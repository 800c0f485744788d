"""Tenants of one Redis, set up exactly as docs/STORES.md says, attacking each other (review N2).

A Redis of its own for this module (tests/support/stores.py): the admin runs the
documented library and load blocks, then the documented ACL line once per namespace. Team
a is the attacker, with its own namespace's credential; team b's sidecar client does its
legitimate writes meanwhile, and each must pass within a second.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from cronlock_sidecar.contract import ANNOTATION_PERMITS
from cronlock_sidecar.lock.model import (
    LeaseRecord,
    Timing,
    claimed,
    read_lease,
    released,
    renewed,
)
from cronlock_sidecar.lock.permits import (
    claimed_permit,
    permit_key,
    read_permits,
    released_permit,
)
from cronlock_sidecar.lock.ticks import TickRecord
from cronlock_sidecar.stores.documents import unversioned
from cronlock_sidecar.stores.redisstore import (
    FUNCTIONS,
    LIBRARY,
    LIBRARY_NAME,
    RedisLeaseStore,
    keys,
    micros,
)
from cronlock_sidecar.stores.url import parse_store_url
from cronlock_sidecar.transport.seam import Forbidden, LeaseRef, NotFound, Unavailable
from tests.support.kube import wait_for
from tests.support.papers import marked_block
from tests.support.paths import ROOT, SIDECAR
from tests.support.stores import RedisServer, running

STORES_MD = ROOT / "docs" / "STORES.md"
UPGRADING_MD = ROOT / "docs" / "UPGRADING.md"
FROZEN_UNTIL = "cronlock.io/frozen-until"
# What docs/STORES.md granted before the function library: EVAL, a loop of which
# stalls every tenant. Kept here to show the attack is real where it is granted.
EVAL_ACL = (
    "ACL SETUSER cronlock-team-a on >PASSWORD resetkeys ~cronlock:{team-a/* resetchannels "
    "-@all +evalsha +eval +script|load +client|setname +time +hmget +hget +hset +exists "
    "+incr +get +set +pexpire +wait"
)
LOOP = "while true do end"
STALLING_LIBRARY = (
    "#!lua name=stall\nredis.register_function('stall', function(keys, args) while true do end end)"
)
# cronlock's own library's name, its functions a loop: what a tenant would put in its place.
IMPOSTOR = f"#!lua name={LIBRARY_NAME}\n" + "".join(
    f"redis.register_function('{name}', function(keys, args) while true do end end)\n"
    for name in FUNCTIONS.values()
)


def documented(marker: str, page: Path = STORES_MD) -> str:
    """The fenced block after `<!-- tested: MARKER -->` in `page`, unindented."""
    return marked_block(page, marker)


def load_as_documented(server: RedisServer, directory: Path) -> None:
    """The admin's blocks: the library saved as cronlock_v2.lua, then the load block run."""
    (directory / f"{LIBRARY_NAME}.lua").write_text(documented("redis-library") + "\n")
    block = (
        documented("redis-library-load")
        .replace("ADMIN_PASSWORD", server.password)
        .replace("--user ADMIN", "--user default")
        .replace("-h HOST -p 6379", f"-h 127.0.0.1 -p {server.port}")
    )
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [LIBRARY_NAME, "OK"], ran.stdout


def add_user(server: RedisServer, namespace: str, acl_line: str, password: str = "") -> str:
    """The ACL line for `namespace` with `password` (else a fresh one), run as the admin;
    its URL."""
    password = password or os.urandom(8).hex()
    line = acl_line.replace("team-a", namespace).replace(">PASSWORD", f">{password}")
    with redis.Redis.from_url(server.url) as admin:
        admin.execute_command(*shlex.split(line))
    return f"redis://cronlock-{namespace}:{password}@127.0.0.1:{server.port}/0"


def libraries(url: str) -> dict[str, tuple[str, dict[str, list[str]]]]:
    """FUNCTION LIST WITHCODE as the admin sees it: each library's code, and its functions'
    flags by name (RESP2 answers each entry as a flat list of names and values)."""
    with redis.Redis.from_url(url, decode_responses=True) as admin:
        entries = admin.function_list(withcode=True)
    found = {}
    for entry in entries:
        fields = dict(zip(entry[::2], entry[1::2], strict=True))
        functions = [dict(zip(f[::2], f[1::2], strict=True)) for f in fields["functions"]]
        flags = {function["name"]: list(function["flags"]) for function in functions}
        found[fields["library_name"]] = (fields["library_code"], flags)
    return found


def client(url: str, *, load_library: bool = True, timeout: float = 5.0) -> RedisLeaseStore:
    """A namespace's client, as its sidecar makes it."""
    return RedisLeaseStore(
        parse_store_url(url, "--store"),
        lambda: datetime.now(UTC),
        timeout,
        load_library=load_library,
    )


@dataclass
class Tenants:
    server: RedisServer
    urls: dict[str, str]


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    with running("redis") as server:
        assert isinstance(server, RedisServer)
        with redis.Redis.from_url(server.url) as admin:
            # BUSY after 0.2 s of a script instead of 5 s: the control test's loop is short.
            admin.config_set("busy-reply-threshold", 200)
            admin.config_set("maxmemory-policy", "volatile-lru")  # undone by the block
        load_as_documented(server, tmp_path_factory.mktemp("admin"))
        urls = {ns: add_user(server, ns, documented("redis-acl")) for ns in ("team-a", "team-b")}
        yield Tenants(server, urls)


def test_the_documented_library_is_the_one_the_sidecar_loads() -> None:
    assert documented("redis-library") == LIBRARY.strip()


def test_the_admin_block_loads_the_library_and_sets_noeviction(tenants: Tenants) -> None:
    with redis.Redis.from_url(tenants.server.url, decode_responses=True) as admin:
        assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert libraries(tenants.server.url) == {
        LIBRARY_NAME: (
            LIBRARY,
            {FUNCTIONS["get"]: ["no-writes"], FUNCTIONS["create"]: [], FUNCTIONS["replace"]: []},
        )
    }


def legitimate_writes(
    team_b: RedisLeaseStore, lock: LeaseRef
) -> tuple[dict[str, float], dict[str, Any], dict[str, Any], LeaseRecord]:
    """b1 creates and renews a 1 s hold, b2 takes it over once it expired, releases it, and
    the lock is frozen: the seconds each write took, the first and the taken-over lock, and
    the lock at the end."""
    steps: dict[str, float] = {}
    timing = Timing.of(1.0, None, 0.0)

    def step(what: str, write: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        began = time.monotonic()
        written = team_b.replace(lock, write(team_b.get(lock)))
        steps[what] = time.monotonic() - began
        return written

    began = time.monotonic()
    body: dict[str, Any] = {"metadata": {"name": lock.name, "namespace": lock.namespace}}
    first = team_b.create(lock, claimed(body, "b1", timing, datetime.now(UTC), ""))
    steps["create"] = time.monotonic() - began
    step("renew", lambda read: renewed(read, timing, datetime.now(UTC)))
    time.sleep(1.2)  # b1's one second passes on the store's clock
    taken = step("takeover", lambda read: claimed(read, "b2", timing, datetime.now(UTC), ""))
    step("release", lambda read: released(read, "b2", datetime.now(UTC)))
    step("freeze", frozen)
    return steps, first, taken, read_lease(team_b.get(lock))


def frozen(read: dict[str, Any]) -> dict[str, Any]:
    """`read` with a freeze until 2099, as `cronlock freeze --store-secret` writes it."""
    metadata = dict(read.get("metadata") or {})
    notes = {**(metadata.get("annotations") or {}), FROZEN_UNTIL: "2099-01-01T00:00:00.000000Z"}
    return {**read, "metadata": {**metadata, "annotations": notes}}


@dataclass
class Attack:
    what: str
    send: Callable[[redis.Redis], object]


def attacks(team_b: LeaseRef, own: LeaseRef, dump: bytes) -> list[Attack]:
    """What team a's credential tries: run code of its own, stop or replace cronlock's
    library, or call cronlock's functions on team b's keys."""
    theirs, mine = keys(team_b), keys(own)
    document = '{"spec":{"holderIdentity":"mallory","leaseDurationSeconds":30}}'
    return [
        Attack("EVAL of a loop", lambda r: r.eval(LOOP, 0)),
        Attack("EVAL_RO of a loop", lambda r: r.execute_command("EVAL_RO", LOOP, 0)),
        Attack("SCRIPT LOAD of a loop", lambda r: r.script_load(LOOP)),
        Attack("EVALSHA of a cached loop", lambda r: r.evalsha("0" * 40, 0)),
        Attack("FUNCTION LOAD of a looping library", lambda r: r.function_load(STALLING_LIBRARY)),
        Attack(
            "FUNCTION LOAD REPLACE of cronlock's library's name",
            lambda r: r.function_load(IMPOSTOR, replace=True),
        ),
        Attack("FUNCTION RESTORE over it", lambda r: r.function_restore(dump, "REPLACE")),
        Attack("FUNCTION DELETE of it", lambda r: r.function_delete(LIBRARY_NAME)),
        Attack("FUNCTION FLUSH", lambda r: r.function_flush()),
        Attack("SCRIPT KILL", lambda r: r.script_kill()),
        Attack("FUNCTION KILL", lambda r: r.function_kill()),
        Attack(
            "CONFIG SET of the eviction policy",
            lambda r: r.config_set("maxmemory-policy", "allkeys-lru"),
        ),
        Attack("FCALL_RO get on b's keys", lambda r: r.fcall_ro(FUNCTIONS["get"], 4, *theirs)),
        Attack(
            "FCALL replace on b's keys",
            lambda r: r.fcall(FUNCTIONS["replace"], 4, *theirs, document, "0", "0", "1", "1"),
        ),
        Attack(
            "FCALL create with b's fence among its own keys",
            lambda r: r.fcall(
                FUNCTIONS["create"], 4, *mine[:2], theirs[2], mine[3], document, "0", "0", "1"
            ),
        ),
        Attack(
            "FCALL create with b's permits' fences among its own keys",
            lambda r: r.fcall(
                FUNCTIONS["create"], 4, *mine[:3], theirs[3], document, "0", "0", "1"
            ),
        ),
        Attack("HSET of b's lock", lambda r: r.hset(theirs[0], "doc", document)),
        Attack("DEL of b's lock", lambda r: r.delete(theirs[0])),
    ]


def test_a_tenant_can_neither_stall_redis_nor_touch_the_library_or_other_locks(
    tenants: Tenants,
) -> None:
    """Team a sends every attack, again and again, while team b creates, renews, takes over,
    releases and freezes its lock: each attack is refused NOPERM, each of b's writes passes
    within a second, and the library is the admin's, unchanged."""
    lock, own = LeaseRef("team-b", "nightly"), LeaseRef("team-a", "nightly")
    with redis.Redis.from_url(tenants.server.url) as admin:
        dump = admin.function_dump()
    assert isinstance(dump, bytes)
    answers: dict[str, set[str]] = {}
    rounds = [0]
    done = threading.Event()

    def attacker() -> None:
        with redis.Redis.from_url(tenants.urls["team-a"], socket_timeout=5) as raw:
            while not done.is_set():
                for attack in attacks(lock, own, dump):
                    try:
                        attack.send(raw)
                        outcome = "carried out"
                    except redis.exceptions.NoPermissionError:
                        outcome = "NOPERM"
                    except redis.RedisError as error:
                        outcome = f"{type(error).__name__}: {error}"
                    answers.setdefault(attack.what, set()).add(outcome)
                rounds[0] += 1

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    try:
        wait_for(lambda: rounds[0] >= 1, 10, "team a's first round of attacks")
        before = rounds[0]
        with client(tenants.urls["team-b"]) as team_b:
            steps, first, taken, after = legitimate_writes(team_b, lock)
        meanwhile = rounds[0] - before
    finally:
        done.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert meanwhile >= 2, "team a's attacks did not go on while team b wrote"
    assert answers == {attack.what: {"NOPERM"} for attack in attacks(lock, own, dump)}
    assert max(steps.values()) < 1.0, steps
    assert read_lease(taken).transitions == read_lease(first).transitions + 1
    assert (after.holder, after.frozen_until is not None) == ("", True)
    assert {name: code for name, (code, _) in libraries(tenants.server.url).items()} == {
        LIBRARY_NAME: LIBRARY
    }


def test_where_eval_is_granted_one_tenants_loop_stalls_the_others(tenants: Tenants) -> None:
    """The control: the ACL docs/STORES.md gave before, on the same server. Team c's loop
    (two to three seconds on Redis' clock) makes team b's reads answer BUSY, and team c may
    not SCRIPT KILL it. The attacks above are this one, refused."""
    url = add_user(tenants.server, "team-c", EVAL_ACL)
    loop = (
        "local s = tonumber(redis.call('TIME')[1]) "
        "while tonumber(redis.call('TIME')[1]) < s + 3 do end return 'done'"
    )
    answer: list[object] = []

    def stall() -> None:
        with redis.Redis.from_url(url, socket_timeout=10) as raw:
            answer.append(raw.eval(loop, 0))

    def busy(team_b: RedisLeaseStore) -> bool:
        try:
            team_b.get(LeaseRef("team-b", "control"))
        except Unavailable as error:
            return "BUSY" in str(error)
        except NotFound:
            pass
        return False

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    try:
        with client(tenants.urls["team-b"]) as team_b:
            wait_for(lambda: busy(team_b), 2, "team b's read to answer BUSY", every=0.05)
        with (
            redis.Redis.from_url(url) as raw,
            pytest.raises(redis.exceptions.NoPermissionError),
        ):
            raw.script_kill()
    finally:
        thread.join(timeout=10)
    assert answer == [b"done"]


@pytest.fixture
def bare_redis() -> Iterator[RedisServer]:
    """A Redis with no library: as an admin leaves it before the load block."""
    with running("redis") as server:
        assert isinstance(server, RedisServer)
        yield server


def test_a_sidecar_without_the_library_says_so_in_one_line(
    bare_redis: RedisServer, tmp_path: Path
) -> None:
    """A tenant's run on a Redis without the library (or with an older one only) runs
    nothing and exits 69 with the line docs/STORES.md shows; a reader's client (`cronlock
    status`) says the same and loads nothing, even as a user who may."""
    older = LIBRARY.replace(LIBRARY_NAME, "cronlock_v0")
    with redis.Redis.from_url(bare_redis.url) as admin:
        admin.function_load(older)
    url = add_user(bare_redis, "reports", documented("redis-acl"))
    run = subprocess.run(
        [str(SIDECAR), "run", "--lease", "reports/nightly", "--", "sh", "-c", "echo RAN"],
        env={**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, "CRONLOCK_STORE": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 69, run.stderr
    assert "RAN" not in run.stdout
    said = [line for line in run.stderr.splitlines() if "function library" in line]
    assert len(said) == 1, run.stderr
    shown = {
        line.strip()
        for page in (STORES_MD, UPGRADING_MD)
        for line in page.read_text().splitlines()
        if "has no function library" in line
    }
    port = f"127.0.0.1:{bare_redis.port}"
    assert len(shown) == 1
    assert said[0].endswith(" " + shown.pop().replace("redis:6379", port)), said[0]
    with (
        client(bare_redis.url, load_library=False) as reader,
        pytest.raises(Forbidden, match=f"has no function library {LIBRARY_NAME}"),
    ):
        reader.get(LeaseRef("reports", "nightly"))
    assert list(libraries(bare_redis.url)) == ["cronlock_v0"]


def test_a_user_allowed_function_load_loads_the_library_once(bare_redis: RedisServer) -> None:
    """A single-tenant Redis's admin URL: the first sidecar loads the library, beside an
    older one (whose sidecars keep running), and a tenant's sidecar then uses it."""
    older = LIBRARY.replace(LIBRARY_NAME, "cronlock_v0")
    lock = LeaseRef("reports", "nightly")
    timing, body = Timing.of(30.0, None, 1.0), {"metadata": {}}
    with redis.Redis.from_url(bare_redis.url, decode_responses=True) as admin:
        admin.function_load(older)
        with client(bare_redis.url) as first:
            first.create(lock, claimed(body, "a", timing, datetime.now(UTC), ""))
        assert sorted(libraries(bare_redis.url)) == ["cronlock_v0", LIBRARY_NAME]
        old_answer = admin.fcall_ro("cronlock_v0_get", 4, *keys(lock))
        assert old_answer[0] == "ok"
    url = add_user(bare_redis, "reports", documented("redis-acl"))
    with client(url) as tenant:
        assert read_lease(tenant.get(lock)).holder == "a"


def test_a_document_larger_than_any_lease_is_never_decoded(tenants: Tenants) -> None:
    """Team a's own lock, by hand: a 4 MiB document is refused as a write, and one stored
    around the functions (HSET) reads as no Lease, so the next write takes the lock at once
    instead of Redis decoding megabytes while every namespace waits."""
    lock = LeaseRef("team-a", "large")
    huge = '{"spec":{"holderIdentity":"mallory","leaseDurationSeconds":86400},"pad":"'
    huge += "x" * (4 << 20) + '"}'
    timing, body = Timing.of(30.0, None, 1.0), {"metadata": {}}
    with client(tenants.urls["team-a"]) as team_a:
        team_a.create(lock, claimed(body, "a", timing, datetime.now(UTC), ""))
        with redis.Redis.from_url(tenants.urls["team-a"], decode_responses=True) as raw:
            version = raw.fcall_ro(FUNCTIONS["get"], 4, *keys(lock))[3]
            arguments = (huge, "0", "0", "60000", version)
            with pytest.raises(redis.ResponseError, match="at most 65536 bytes"):
                raw.fcall(FUNCTIONS["replace"], 4, *keys(lock), *arguments)
            raw.hset(keys(lock)[0], "doc", huge)
        read = {key: value for key, value in team_a.get(lock).items() if key != "pad"}
        taken = team_a.replace(lock, claimed(read, "b", timing, datetime.now(UTC), ""))
    assert read_lease(taken).holder == "b"


def test_an_install_of_before_moves_to_the_library_as_upgrading_says(
    bare_redis: RedisServer, tmp_path: Path
) -> None:
    """docs/UPGRADING.md's steps on a Redis set up as before (the `+eval` ACL, no library):
    after step 1 the new sidecar's client works and the old ones' EVAL still does; after
    step 3 EVAL is refused and the new client still works."""
    password = os.urandom(8).hex()
    url = add_user(bare_redis, "team-a", EVAL_ACL, password)
    lock, timing = LeaseRef("team-a", "nightly"), Timing.of(30.0, None, 1.0)
    with redis.Redis.from_url(url) as raw:
        assert raw.eval("return 1", 0) == 1  # the sidecars of before
        load_as_documented(bare_redis, tmp_path)
        grant = documented("redis-grant-fcall", UPGRADING_MD)
        with redis.Redis.from_url(bare_redis.url) as admin:
            admin.execute_command(*shlex.split(grant))
        with client(url) as team_a:
            team_a.create(lock, claimed({"metadata": {}}, "a", timing, datetime.now(UTC), ""))
        assert raw.eval("return 1", 0) == 1
        assert add_user(bare_redis, "team-a", documented("redis-acl"), password) == url
        with pytest.raises(redis.exceptions.NoPermissionError):
            raw.eval("return 1", 0)
        with client(url) as team_a:
            assert read_lease(team_a.get(lock)).holder == "a"


def test_a_write_under_replicas_loads_the_library_in_its_pipeline(bare_redis: RedisServer) -> None:
    """`?replicas=1`: the first write is FCALL and WAIT in one pipeline; the library missing,
    the admin's URL loads it and sends the pipeline again, whose WAIT then counts (no
    replica here: the write does not count, and says so)."""
    lock = LeaseRef("reports", "replicated")
    timing = Timing.of(30.0, None, 1.0)
    with (
        client(bare_redis.url + "?replicas=1", timeout=1.0) as writer,
        pytest.raises(Unavailable, match="the write reached 0 of the 1 replicas"),
    ):
        writer.create(lock, claimed({"metadata": {}}, "a", timing, datetime.now(UTC), ""))
    assert list(libraries(bare_redis.url)) == [LIBRARY_NAME]


def test_sidecars_that_find_the_library_missing_together_all_go_on(
    bare_redis: RedisServer,
) -> None:
    """Eight clients of a user allowed FUNCTION LOAD read at once on a Redis without the
    library: those whose load comes second ("already exists") call the function again.
    Repeated, with the library deleted by the admin each time, until Redis counted such a
    failed load; every read of every round found the lock free."""
    lock, clients = LeaseRef("reports", "together"), 8
    raced = 0
    with redis.Redis.from_url(bare_redis.url, decode_responses=True) as admin:
        for _ in range(20):
            with suppress(redis.ResponseError):
                admin.function_delete(LIBRARY_NAME)
            admin.config_resetstat()
            start = threading.Barrier(clients)
            answers: list[str] = []

            def read(start: threading.Barrier = start, answers: list[str] = answers) -> None:
                with client(bare_redis.url) as reader:
                    start.wait(timeout=10)
                    try:
                        reader.get(lock)
                        answers.append("found")
                    except NotFound:
                        answers.append("free")
                    except (Forbidden, Unavailable) as error:
                        answers.append(str(error))

            threads = [threading.Thread(target=read) for _ in range(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            assert answers == ["free"] * clients
            loads = admin.info("commandstats").get("cmdstat_function|load", {})
            raced = int(loads.get("failed_calls", 0))
            if raced:
                break
    assert raced >= 1, "no two clients loaded the library at once in 20 rounds"


# --- permits (issue 58, item 1): a tenant with the lock's credential, through raw FCALL ---
TTL_30S = Timing.of(30.0, None, 1.0)
HERE = Path(__file__).parent
LIBRARY_V3 = (HERE / "redis_library_v3.lua").read_text()


def permit_lock(url: str, lock: LeaseRef, count: int, holders: list[str]) -> None:
    """`lock` of `count` permits, permit K held for 30 s by `holders[K]`, each claimed by
    its own client as its run's sidecar claims it."""
    body: dict[str, Any] = {"metadata": {"annotations": {ANNOTATION_PERMITS: str(count)}}}
    with client(url) as first:
        first.create(lock, claimed(body, holders[0], TTL_30S, datetime.now(UTC), ""))
    for index, holder in enumerate(holders[1:], start=1):
        with client(url) as run:
            read = run.get(lock)
            run.replace(lock, claimed_permit(read, index, holder, TTL_30S, datetime.now(UTC), ""))


def raw_write(
    url: str,
    lock: LeaseRef,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    spec_age: str = "",
    ages: str = "",
) -> list[Any] | str:
    """The tenant's own FCALL of the library's replace: `change` of the lock as read, with
    the renewals it names; the answer, or the error's text."""
    with client(url) as reader:
        read = reader.get(lock)
    document = json.dumps(unversioned(change(read)), separators=(",", ":"))
    named = keys(lock)
    version = str(read["metadata"]["resourceVersion"])
    with redis.Redis.from_url(url, decode_responses=True) as raw:
        try:
            answer = raw.fcall(
                FUNCTIONS["replace"], len(named), *named, document, micros(datetime.now(UTC)),
                spec_age, "60000", version, ages,
            )  # fmt: skip
        except redis.ResponseError as error:
            return str(error)
    assert isinstance(answer, list)
    return answer


def holders_of(url: str, lock: LeaseRef) -> list[str]:
    with client(url) as reader:
        return [permit.holder for permit in read_permits(reader.get(lock))]


def noted(body: dict[str, Any], **notes: str) -> dict[str, Any]:
    """`body` with these annotations (`permits` for cronlock.io/permits)."""
    written = copy.deepcopy(body)
    annotations = written.setdefault("metadata", {}).setdefault("annotations", {})
    for key, value in notes.items():
        annotations[ANNOTATION_PERMITS if key == "permits" else key] = value
    return written


def fresh_lock(name: str) -> LeaseRef:
    return LeaseRef("team-a", f"{name}-{os.getpid()}-{time.monotonic_ns()}")


def test_a_tenant_cannot_take_a_live_permit_of_another_holder(tenants: Tenants) -> None:
    """w holds permit 0 and v permit 1: mallory's claim of either, through the sidecar's
    client or a raw FCALL, is the `held` answer naming the permit; nothing changes."""
    url, lock = tenants.urls["team-a"], fresh_lock("live")
    permit_lock(url, lock, 2, ["w", "v"])
    now = datetime.now(UTC)
    with client(url) as mallory:
        with pytest.raises(Forbidden, match="permit 1 of the lock is held by v, renewed"):
            mallory.replace(lock, claimed_permit(mallory.get(lock), 1, "mallory", TTL_30S, now, ""))
        with pytest.raises(Forbidden, match="the lock is held by w, renewed"):
            mallory.replace(lock, claimed(mallory.get(lock), "mallory", TTL_30S, now, ""))
    answer = raw_write(
        url, lock, lambda read: claimed_permit(read, 1, "mallory", TTL_30S, now, ""), ages="1=0"
    )
    assert isinstance(answer, list)
    assert (answer[0], answer[2], answer[5]) == ("held", "v", "1")
    assert holders_of(url, lock) == ["w", "v"]


def test_a_tenant_cannot_hold_two_permits(tenants: Tenants) -> None:
    """mallory holds permit 1 of 3: its claim of the free permit 2 too is refused, and so is
    the spec under its name once w released it; another name takes permit 2 (the control)."""
    url, lock = tenants.urls["team-a"], fresh_lock("two")
    permit_lock(url, lock, 3, ["w", "mallory"])
    now = datetime.now(UTC)
    two = raw_write(url, lock, lambda read: claimed_permit(read, 2, "mallory", TTL_30S, now, ""))
    assert "cronlock store: permits 1 and 2 would both be held by mallory" in str(two)
    with client(url) as w:
        w.replace(lock, released(w.get(lock), "w", now))
    spec = raw_write(url, lock, lambda read: claimed(read, "mallory", TTL_30S, now, ""))
    assert "permits 0 and 1 would both be held by mallory" in str(spec)
    assert holders_of(url, lock) == ["", "mallory", ""]
    other = raw_write(url, lock, lambda read: claimed_permit(read, 2, "eve", TTL_30S, now, ""))
    assert isinstance(other, list)
    assert other[0] == "ok"
    assert holders_of(url, lock) == ["", "mallory", "eve"]


def test_a_tenant_cannot_take_two_free_permits_in_one_write(tenants: Tenants) -> None:
    """Permits 1 and 2 of 3 free: one write claiming both (as m1 and m2) is refused; each
    in a write of its own passes (the control)."""
    url, lock = tenants.urls["team-a"], fresh_lock("both")
    permit_lock(url, lock, 3, ["w"])
    now = datetime.now(UTC)

    def both(read: dict[str, Any]) -> dict[str, Any]:
        once = claimed_permit(read, 1, "m1", TTL_30S, now, "")
        return claimed_permit(once, 2, "m2", TTL_30S, now, "")

    answer = raw_write(url, lock, both, ages="1=0 2=0")
    assert "cronlock store: a write claims one permit at most; this one claims permits 1 and 2" in (
        str(answer)
    )
    assert holders_of(url, lock) == ["w", "", ""]
    for index, name in ((1, "m1"), (2, "m2")):
        alone = raw_write(
            url, lock, lambda read, i=index, n=name: claimed_permit(read, i, n, TTL_30S, now, "")
        )
        assert isinstance(alone, list)
        assert alone[0] == "ok"
    assert holders_of(url, lock) == ["w", "m1", "m2"]


def test_a_tenant_cannot_move_n_while_a_permit_is_held(tenants: Tenants) -> None:
    """w and v hold a lock of 2: N written as 3 or 1 is refused, and so is N written as
    NBSP-3 or " 2\\t", which a document's reader (lock/permits.py `document_count`) and the
    library both read as 1; under N = 2 v's permit is still v's. Once both gave theirs
    back, N moves (the control)."""
    url, lock = tenants.urls["team-a"], fresh_lock("count")
    permit_lock(url, lock, 2, ["w", "v"])
    now = datetime.now(UTC)
    for count in ("3", "1", "\u00a03", " 2\t"):
        answer = raw_write(url, lock, lambda read, n=count: noted(read, permits=n))
        assert "cronlock store: cronlock.io/permits changes only while no permit of the lock " in (
            str(answer)
        ), count
        assert "permit 0 of 2 is held by w" in str(answer)
    taken = raw_write(
        url, lock, lambda read: claimed_permit(read, 1, "mallory", TTL_30S, now, ""), ages="1=0"
    )
    assert isinstance(taken, list)
    assert (taken[0], taken[2], taken[5]) == ("held", "v", "1")
    with client(url) as w:
        w.replace(lock, released(w.get(lock), "w", now))
    with client(url) as v:
        v.replace(lock, released_permit(v.get(lock), 1, "v", now))
    raised = raw_write(url, lock, lambda read: noted(read, permits="3"))
    assert isinstance(raised, list)
    assert raised[0] == "ok"
    assert holders_of(url, lock) == ["", "", ""]


def test_a_forged_token_or_renew_time_is_not_what_readers_see(tenants: Tenants) -> None:
    """mallory holds permit 1 for 1 s and writes its entry with transitions 999 and a renew
    time in 2099: readers see the store's token and renewal, and once its second has passed
    on the store's clock another run takes the permit over, with the next token."""
    url, lock = tenants.urls["team-a"], fresh_lock("forged")
    permit_lock(url, lock, 2, ["w"])
    one_second = Timing.of(1.0, None, 0.0)
    with client(url) as mallory:
        read = mallory.get(lock)
        mallory.replace(lock, claimed_permit(read, 1, "mallory", one_second, datetime.now(UTC), ""))
        token = read_permits(mallory.get(lock))[1].transitions
    assert token == 1
    future = datetime(2099, 1, 1, tzinfo=UTC)

    def forged(read: dict[str, Any]) -> dict[str, Any]:
        entry = read_permits(read)[1]._replace(transitions=999, renew_time=future)
        return noted(read, **{permit_key(1): entry.text()})

    answer = raw_write(url, lock, forged)
    assert isinstance(answer, list)
    assert answer[0] == "ok"
    with client(url) as reader:
        seen = read_permits(reader.get(lock))[1]
    assert (seen.holder, seen.transitions) == ("mallory", 1)
    assert seen.renew_time is not None
    assert seen.renew_time <= datetime.now(UTC)
    time.sleep(1.2)  # mallory's one second passes on the store's clock
    with client(url) as other:
        read = other.get(lock)
        taken = other.replace(lock, claimed_permit(read, 1, "b", TTL_30S, datetime.now(UTC), ""))
    assert read_permits(taken)[1].transitions == 2


def test_a_tick_record_names_the_holder_of_the_permit_claimed(tenants: Tenants) -> None:
    """mallory claims permit 1 with a tick record naming w, the spec's holder: refused; the
    same claim with its own name on the record passes (the control)."""
    url, lock = tenants.urls["team-a"], fresh_lock("tick")
    permit_lock(url, lock, 2, ["w"])
    now = datetime.now(UTC)
    at = now.replace(microsecond=0) - timedelta(seconds=30)
    job = f"nightly-{int(at.timestamp()) // 60}"

    def claim(holder: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        record = TickRecord("nightly", at, job, "uid-mallory", holder, "")
        return lambda read: claimed_permit(read, 1, "mallory", TTL_30S, now, "", record)

    refused = raw_write(url, lock, claim("w"), ages="1=0")
    assert "tick record cronlock.io/tick.nightly: it names holder w, not the claim's mallory" in (
        str(refused)
    )
    assert holders_of(url, lock) == ["w", ""]
    passed = raw_write(url, lock, claim("mallory"), ages="1=0")
    assert isinstance(passed, list)
    assert passed[0] == "ok"
    assert holders_of(url, lock) == ["w", "mallory"]


def test_version_3_beside_version_4_lets_a_tenant_take_a_live_permit_until_deleted(
    tenants: Tenants,
) -> None:
    """During the upgrade version 3 is loaded beside version 4: through it mallory takes v's
    live permit (the control: version 3 judges the spec only), and the permit it wrote
    reads as long expired (no record of the store's names mallory). After docs/UPGRADING.md's
    `FUNCTION DELETE cronlock_v3` that call is refused."""
    url, lock = tenants.urls["team-a"], fresh_lock("v3")
    permit_lock(url, lock, 2, ["w", "v"])
    now = datetime.now(UTC)
    with redis.Redis.from_url(tenants.server.url, decode_responses=True) as admin:
        admin.function_load(LIBRARY_V3)
    try:
        with client(url) as reader:
            read = reader.get(lock)
        document = json.dumps(
            unversioned(claimed_permit(read, 1, "mallory", TTL_30S, now, "")),
            separators=(",", ":"),
        )
        version = str(read["metadata"]["resourceVersion"])
        with redis.Redis.from_url(url, decode_responses=True) as raw:
            answer = raw.fcall(
                "cronlock_v3_replace", 3, *keys(lock)[:3], document, micros(now), "0", "60000",
                version,
            )  # fmt: skip
        assert answer[0] == "ok", answer
        with client(url) as reader:
            taken = read_permits(reader.get(lock))[1]
        assert taken.holder == "mallory"
        assert taken.renew_time is not None
        assert taken.renew_time.year == 1970
    finally:
        with redis.Redis.from_url(tenants.server.url, decode_responses=True) as admin:
            admin.execute_command(*shlex.split(documented("redis-delete-v3", UPGRADING_MD)))
    with (
        redis.Redis.from_url(url, decode_responses=True) as raw,
        pytest.raises(redis.ResponseError, match="Function not found"),
    ):
        raw.fcall("cronlock_v3_replace", 3, *keys(lock)[:3], document, micros(now), "0", "1", "1")
    assert list(libraries(tenants.server.url)) == [LIBRARY_NAME]
