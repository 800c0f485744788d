"""The lock in Redis (≥ 7) or Valkey: a Lease document per lock, written only by compare-and-set.

Each lock is three keys sharing one hash tag (so a Redis Cluster keeps them on one node):
`cronlock:{NS/NAME}:lease`, a hash with the Lease document as the sidecar writes it (on its
writer's clock), its version, its fencing token and the writer's and the store's clock at
the write; `…:version` and `…:fence`, counters that only grow. Every write is one Lua
script, atomic on the server: a create only where no lock is (SET NX's rule), a replace
only of the version the writer read (so renewals and releases are the owner's alone, as
any takeover is the one its reader judged). The fencing token is the Lease's transitions,
and the `fence` counter never goes below any token handed out, so a lock deleted by hand
(or lost in a failover) is created again with a higher one. Ages are judged on Redis'
clock (`transport.frames`). An idle lock's hash expires after a week; the counters stay.

redis-py is imported here only, and only when a CronJob or `run --store` chooses Redis.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from cronlock_sidecar.transport.documents import stamped, token_of, unversioned, version_read
from cronlock_sidecar.transport.frames import to_reader
from cronlock_sidecar.transport.seam import (
    Conflict,
    Forbidden,
    Lease,
    LeaseRef,
    NotFound,
    Unavailable,
)
from cronlock_sidecar.transport.storeurl import StoreUrl

IDLE_EXPIRY_MS = 7 * 24 * 3600 * 1000

# KEYS: lease, version, fence. The store's time as one string of microseconds.
_NOW = """
local t = redis.call('TIME')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
"""
_GET = (
    _NOW
    + """
local v = redis.call('HMGET', KEYS[1], 'doc', 'version', 'fence', 'writer', 'written')
if not v[1] then return {'missing', now} end
return {'ok', now, v[1], v[2], v[3], v[4], v[5]}
"""
)
# ARGV: document, writer's time (µs), token asked for, idle expiry (ms)
_CREATE = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return {'conflict', now} end
local fence = redis.call('INCR', KEYS[3])
local asked = tonumber(ARGV[3])
if asked > fence then redis.call('SET', KEYS[3], ARGV[3]); fence = asked end
local version = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'version', version, 'fence', fence,
           'writer', ARGV[2], 'written', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'ok', now, tostring(version), tostring(fence)}
"""
)
# ARGV: document, writer's time (µs), token, idle expiry (ms), the version read
_REPLACE = (
    _NOW
    + """
local current = redis.call('HGET', KEYS[1], 'version')
if not current then return {'missing', now} end
if current ~= ARGV[5] then return {'conflict', now} end
local fence = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[3]) > fence then redis.call('SET', KEYS[3], ARGV[3]) end
local version = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'version', version, 'fence', ARGV[3],
           'writer', ARGV[2], 'written', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'ok', now, tostring(version), ARGV[3]}
"""
)


def keys(lease: LeaseRef) -> list[str]:
    tag = "{" + str(lease) + "}"
    return [f"cronlock:{tag}:lease", f"cronlock:{tag}:version", f"cronlock:{tag}:fence"]


def micros(moment: datetime) -> str:
    return str(int(moment.timestamp() * 1_000_000))


def moment(text: str) -> datetime:
    return datetime.fromtimestamp(int(text) / 1_000_000, UTC)


class RedisLeaseStore:
    """LeaseTransport on Redis; `now` is the sidecar's wall clock (what it writes times on)."""

    def __init__(self, url: StoreUrl, now: Callable[[], datetime], timeout: float = 5.0) -> None:
        self.url = url
        self.now = now
        self.client: redis.Redis = redis.Redis.from_url(
            url.secret,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
            client_name="cronlock-sidecar",
        )
        self._scripts: dict[str, Script] = {
            "get": self.client.register_script(_GET),
            "create": self.client.register_script(_CREATE),
            "replace": self.client.register_script(_REPLACE),
        }
        self._lock = threading.Lock()

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        answer = self._call("get", "get", lease, [])
        reader_now = self.now()
        if answer[0] == "missing":
            raise NotFound("get", lease, f"no lock in {self.url}")
        _, store_now, document, version, fence, writer, written = answer
        body = to_reader(
            json.loads(document),
            writer_time=moment(writer),
            written_at=moment(written),
            store_now=moment(store_now),
            reader_now=reader_now,
        )
        return stamped(body, version, fence)

    def create(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        return self._write("create", lease, body, [])

    def replace(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        version = version_read(body)
        if not version:
            raise Conflict("update", lease, "no version read to compare with")
        return self._write("update", lease, body, [version])

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RedisLeaseStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _write(self, verb: str, lease: LeaseRef, body: Lease, extra: list[str]) -> Lease:
        document = unversioned(body)
        arguments = [
            json.dumps(document, separators=(",", ":")),
            micros(self.now()),
            str(token_of(body)),
            str(IDLE_EXPIRY_MS),
            *extra,
        ]
        script = "create" if verb == "create" else "replace"
        answer = self._call(verb, script, lease, arguments)
        if answer[0] == "missing":
            raise NotFound(verb, lease, f"no lock in {self.url}")
        if answer[0] == "conflict":
            raise Conflict(verb, lease, "written by someone else since it was read")
        _, _store_now, version, fence = answer
        return stamped(document, version, fence)

    def _call(self, verb: str, script: str, lease: LeaseRef, arguments: list[str]) -> list[Any]:
        try:
            with self._lock:
                answer = self._scripts[script](keys=keys(lease), args=arguments)
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as error:
            raise Forbidden(verb, lease, f"{self.url}: {error}") from None
        except redis.ReadOnlyError as error:
            raise Unavailable(verb, lease, f"{self.url} is a read-only replica: {error}") from None
        except redis.RedisError as error:
            raise Unavailable(verb, lease, f"{self.url}: {type(error).__name__}: {error}") from None
        if not isinstance(answer, list) or not answer:
            raise Unavailable(verb, lease, f"{self.url}: unexpected answer {answer!r}")
        return answer
