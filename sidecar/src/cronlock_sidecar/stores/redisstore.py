"""The lock in Redis (≥ 7) or Valkey: a Lease document per lock, written only by compare-and-set.

Each lock is three keys sharing one hash tag (so a Redis Cluster keeps them on one node):
`cronlock:{NS/NAME}:lease`, a hash with the Lease document as the sidecar writes it (on its
writer's clock), its version, its fencing token, the writer's and the store's clock at
the write and the store's time of the holder's last renewal; `…:version` and `…:fence`,
counters that only grow. Every write is one function of cronlock's Redis Function
library (`LIBRARY`, called by FCALL), atomic on the server: a create only where no lock
is (SET NX's rule), a replace only of the version the writer read, and both keep the
lock's rules whatever the writer sends: the holder changes only on a free, expired (on
Redis' clock) or same-Job hold, the duration is 1..86400 s, and the function alone sets
the fencing token (one more than any handed out on a new holder, unchanged otherwise;
the `fence` counter keeps the highest, so a lock deleted by hand or lost in a failover
is created again with a higher one) and the times. Ages are judged on Redis'
clock (`stores.frames`). An idle lock's hash expires after a week; the counters stay.
A user allowed HSET on the keys can still write them around the function: Redis checks a
function's commands against the caller's ACL, so nothing lets a user run it but not HSET
(docs/STORES.md: credentials per namespace). Tenants need no EVAL: the library is loaded
once, by an admin or by the first sidecar whose user may.

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
from redis.retry import Retry

from cronlock_sidecar.stores.documents import (
    STORE_REFUSAL,
    TICK_AHEAD_SECONDS,
    held_refusal,
    renewal_age,
    stamped,
    unversioned,
    version_read,
)
from cronlock_sidecar.stores.frames import to_reader
from cronlock_sidecar.stores.url import REPLICAS_DOCS, StoreUrl
from cronlock_sidecar.transport.seam import (
    Conflict,
    Forbidden,
    Lease,
    LeaseRef,
    NotFound,
    Unavailable,
)

IDLE_EXPIRY_MS = 7 * 24 * 3600 * 1000
LONGEST_DURATION_SECONDS = 86400  # the operator's longest ttl (MAX_TTL_SECONDS)

# The scripts are one Redis Function library, loaded once (FUNCTION LOAD) by an admin or
# by the first sidecar whose user may: tenants are granted FCALL on it and nothing that
# runs code of their own (EVAL, FUNCTION LOAD), whose loop would stall the whole server
# (security review N2). The version is in the library's and the functions' names, so a
# newer cronlock's library loads beside an older one's and both fleets run during an
# upgrade; a sidecar whose library is missing says so in one line (`missing_library`).
LIBRARY_NAME = "cronlock_v3"
FUNCTIONS = {name: f"{LIBRARY_NAME}_{name}" for name in ("get", "create", "replace")}
LIBRARY_DOCS = 'docs/STORES.md, "Redis: the function library"'

# Each function's KEYS: lease, version, fence. `now`: the store's time as one string of
# microseconds. `parsed`: the fields the rules read from a stored or written document
# (cjson, bundled with Redis' Lua); a document that does not parse, or is larger than any
# Lease (64 KiB: decoding a huge one would stall the server), reads as free (only a raw
# write by hand can store one). ARGV of the writes: document, writer's time (µs), how long
# before the writer's time the document's renewTime is (µs: only ever makes the write's
# own renewal older), idle expiry (ms), and for a replace the version read. The writer's
# time only places the document's other moments (acquireTime, released-at) on readers'
# clocks; every age the rules or readers judge is the store's `renewed`. A replace keeps
# the holders' rules: it may change the holder only of a free hold, an expired one (on
# the store's clock, for the shorter of its duration and the one the new holder writes),
# or one of an earlier pod of the same Job; a release names the holder it releases for.
# The token is the store's: one more than any handed out on a new holder, unchanged
# otherwise. Missing fields (a hash of schema 1) read as: renewed = written. The tick
# records (`cronlock.io/tick.<cronjob>`, lock/ticks.py) keep each tick at most once
# whoever writes (`ticks`; docs/STORES.md, "Tick records in a store"): only a claim adds
# or changes one, naming its own holder, never ahead of Redis' clock + TICK_AHEAD_SECONDS,
# never back to an older tick or to the same tick of another run; no write drops one.
# The success records (`cronlock.io/succeeded.<cronjob>`, `successes`; docs/STORES.md,
# "Success records in a store") are written only by the holder's release (`run` whose
# command exited 0), each equal to the releasing holder's own claim record of that
# CronJob, never back to an older tick; no write drops one. Version 2 of the library added
# the tick records, version 3 the success records: an older version keeps none of the
# newer rules, so it is deleted once no sidecar of the release before calls it
# (docs/UPGRADING.md).
LIBRARY = """#!lua name=cronlock_v3
-- cronlock's lock rules (docs/STORES.md); KEYS: lease, version, fence.
local LONGEST = __LONGEST__
local LARGEST = 65536
local REFUSAL = '__REFUSAL__'
local TICKS = 'cronlock.io/tick.'
local SUCCEEDED = 'cronlock.io/succeeded.'
local AHEAD = __AHEAD__
local function clock()
  local t = redis.call('TIME')
  local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  return now, tonumber(now)
end
local function text(value) if type(value) == 'string' then return value end return '' end
local function parsed(document)
  if type(document) ~= 'string' or #document > LARGEST then return nil end
  local ok, lease = pcall(cjson.decode, document)
  if not ok or type(lease) ~= 'table' then return nil end
  local spec = type(lease.spec) == 'table' and lease.spec or {}
  local meta = type(lease.metadata) == 'table' and lease.metadata or {}
  local notes = type(meta.annotations) == 'table' and meta.annotations or {}
  return {holder = text(spec.holderIdentity), duration = spec.leaseDurationSeconds,
          job = text(notes['cronlock.io/holder-job']),
          last = text(notes['cronlock.io/last-holder']), notes = notes}
end
local function digits(value) return string.format('%.0f', value) end
-- Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
local function days(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end
local MONTH = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
-- A tick record `<tick> <job|-> <run> <holder> <cluster|->`: its tick (seconds since the
-- epoch), run and holder; nil for anything else (lock/ticks.py reads the same).
local function record(value)
  if type(value) ~= 'string' then return nil end
  local f = {string.match(value, '^([!-~]+) ([!-~]+) ([!-~]+) ([!-~]+) ([!-~]+)$')}
  if #f ~= 5 then return nil end
  for i = 1, 5 do if #f[i] > 253 then return nil end end
  local t = {string.match(f[1], '^(%d%d%d%d)%-(%d%d)%-(%d%d)T(%d%d):(%d%d):(%d%d)Z$')}
  if #t ~= 6 then return nil end
  for i = 1, 6 do t[i] = tonumber(t[i]) end
  local y, m, d = t[1], t[2], t[3]
  local leap = y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0)
  if y < 1 or m < 1 or m > 12 or d < 1 or d > MONTH[m] or (m == 2 and d == 29 and not leap)
     or t[4] > 23 or t[5] > 59 or t[6] > 59 then
    return nil
  end
  return {at = days(y, m, d) * 86400 + t[4] * 3600 + t[5] * 60 + t[6], run = f[3],
          holder = f[4]}
end
local function tick_key(key)
  return type(key) == 'string' and string.sub(key, 1, #TICKS) == TICKS
end
-- The tick records' rules: a record is added or changed only by a claim, names the claim's
-- holder, is not ahead of the store's clock + AHEAD, and is not older than (nor the same
-- tick of another run as) the record it replaces, unless that one is ahead (nobody's);
-- no write drops one. An error reply, or nil.
local function ticks(old_notes, new, claim, now_us)
  local function refused(key, why)
    return redis.error_reply(REFUSAL .. ' tick record ' .. key .. ': ' .. why)
  end
  for key, value in pairs(old_notes) do
    if tick_key(key) and type(value) == 'string' and type(new.notes[key]) ~= 'string' then
      return refused(key, 'every write carries it (a claim may replace it, none drops it)')
    end
  end
  local latest = math.floor(now_us / 1000000) + AHEAD
  for key, value in pairs(new.notes) do
    if tick_key(key) and type(value) == 'string' and old_notes[key] ~= value then
      if not claim then
        return refused(key, 'only a claim (a new holder) writes one; a renewal or a release '
                            .. 'carries each unchanged')
      end
      local mine = record(value)
      if not mine then
        return refused(key, 'not <tick> <job|-> <run> <holder> <cluster|->, the tick in '
                            .. 'RFC 3339 whole seconds (2026-12-06T12:00:00Z)')
      end
      if mine.holder ~= new.holder then
        return refused(key, "it names holder " .. mine.holder .. ", not the claim's "
                            .. new.holder)
      end
      if mine.at > latest then
        return refused(key, "its tick is more than " .. AHEAD .. " s ahead of the store's clock")
      end
      local theirs = record(old_notes[key])
      if theirs and theirs.at <= latest then
        if mine.at < theirs.at then
          return refused(key, 'its tick is older than the recorded one')
        end
        if mine.at == theirs.at and mine.run ~= theirs.run then
          return refused(key, 'its tick was claimed by another run (' .. theirs.run .. ')')
        end
      end
    end
  end
  return nil
end
local function success_key(key)
  return type(key) == 'string' and string.sub(key, 1, #SUCCEEDED) == SUCCEEDED
end
-- The success records' rules: a record is added or changed only by the holder's release
-- (no holder now, last-holder the one before), equal to that holder's own claim record
-- of the same CronJob, and not older than the recorded success unless that one is ahead
-- (nobody's); no write drops one. An error reply, or nil.
local function successes(old_notes, new, old_holder, now_us)
  local function refused(key, why)
    return redis.error_reply(REFUSAL .. ' success record ' .. key .. ': ' .. why)
  end
  for key, value in pairs(old_notes) do
    if success_key(key) and type(value) == 'string' and type(new.notes[key]) ~= 'string' then
      return refused(key, "every write carries it (the holder's release may move it, none "
                          .. 'drops it)')
    end
  end
  local latest = math.floor(now_us / 1000000) + AHEAD
  for key, value in pairs(new.notes) do
    if success_key(key) and type(value) == 'string' and old_notes[key] ~= value then
      if old_holder == '' or new.holder ~= '' or new.last ~= old_holder then
        return refused(key, "only the holder's release writes one")
      end
      local claim = old_notes[TICKS .. string.sub(key, #SUCCEEDED + 1)]
      local mine = record(claim)
      if not mine or value ~= claim or mine.holder ~= old_holder then
        return refused(key, "it is not the releasing holder's own claim record (its tick "
                            .. 'and run)')
      end
      local theirs = record(old_notes[key])
      if theirs and theirs.at <= latest and mine.at < theirs.at then
        return refused(key, 'its tick is older than the recorded success')
      end
    end
  end
  return nil
end
-- The written document's rules; its lease and renewal time, or an error reply.
local function checked(args, now_us)
  local new = parsed(args[1])
  if not new then
    return nil, nil, redis.error_reply(REFUSAL .. ' the document is not a JSON object of at most '
                                       .. LARGEST .. ' bytes')
  end
  local d = new.duration
  -- A document with no holder may have no duration (a freeze on a lock never taken).
  if (new.holder ~= '' or d ~= nil)
     and (type(d) ~= 'number' or d ~= math.floor(d) or d < 1 or d > LONGEST) then
    return nil, nil, redis.error_reply(REFUSAL .. ' leaseDurationSeconds must be a whole number'
                                       .. ' from 1 to ' .. LONGEST)
  end
  local age = tonumber(args[3]) or 0
  if age < 0 then age = 0 end
  return new, math.max(0, now_us - age), nil
end

local function get(keys, args)
  local now = clock()
  local v = redis.call('HMGET', keys[1], 'doc', 'version', 'fence', 'writer', 'written',
                       'renewed')
  if not v[1] then return {'missing', now} end
  return {'ok', now, v[1], v[2], v[3], v[4], v[5], v[6] or v[5]}
end

local function create(keys, args)
  local now, now_us = clock()
  local new, renewal, refused = checked(args, now_us)
  if refused then return refused end
  if redis.call('EXISTS', keys[1]) == 1 then return {'conflict', now} end
  refused = ticks({}, new, new.holder ~= '', now_us)
    or successes({}, new, '', now_us)
  if refused then return refused end
  local fence = redis.call('INCR', keys[3])
  local version = redis.call('INCR', keys[2])
  redis.call('HSET', keys[1], 'doc', args[1], 'version', version, 'fence', fence,
             'writer', args[2], 'written', now, 'renewed', digits(renewal))
  redis.call('PEXPIRE', keys[1], args[4])
  return {'ok', now, tostring(version), tostring(fence)}
end

local function replace(keys, args)
  local now, now_us = clock()
  local new, renewal, refused = checked(args, now_us)
  if refused then return refused end
  local v = redis.call('HMGET', keys[1], 'version', 'doc', 'fence', 'renewed', 'written')
  if not v[1] then return {'missing', now} end
  if v[1] ~= args[5] then return {'conflict', now} end
  local old = parsed(v[2]) or {holder = '', duration = 0, job = '', last = '', notes = {}}
  local old_duration = tonumber(old.duration) or 0
  old_duration = math.min(math.max(old_duration, 0), LONGEST)
  local renewed = tonumber(v[4] or v[5] or '0') or 0
  if renewed > now_us then renewed = 0 end  -- a time the store never wrote
  local since = now_us - renewed
  local lasts = old_duration
  if new.holder ~= '' then lasts = math.min(lasts, new.duration) end
  local prefix = string.sub(old.job .. '-', 1, 58)
  local allowed = old.holder == '' or new.holder == old.holder
    or (new.holder == '' and new.last == old.holder)
    or since > lasts * 1000000
    or (old.job ~= '' and new.holder ~= '' and new.job == old.job
        and string.sub(new.holder, 1, #prefix) == prefix)
  if not allowed then
    return {'held', now, old.holder, digits(since), digits(old_duration)}
  end
  -- A claim: a new holder, or a holder taking its own expired hold again.
  local claim = new.holder ~= '' and (new.holder ~= old.holder or since > lasts * 1000000)
  refused = ticks(old.notes, new, claim, now_us)
    or successes(old.notes, new, old.holder, now_us)
  if refused then return refused end
  local token = tonumber(v[3]) or 0
  local fence = tonumber(redis.call('GET', keys[3]) or '0') or 0
  if new.holder ~= '' and new.holder ~= old.holder then
    token = math.max(token, fence) + 1
  elseif new.holder == old.holder and new.holder ~= '' then
    renewal = math.max(renewal, renewed)
  end
  if new.holder == '' then renewal = renewed end
  if token > fence then redis.call('SET', keys[3], digits(token)) end
  local version = redis.call('INCR', keys[2])
  redis.call('HSET', keys[1], 'doc', args[1], 'version', version, 'fence', digits(token),
             'writer', args[2], 'written', now, 'renewed', digits(renewal))
  redis.call('PEXPIRE', keys[1], args[4])
  return {'ok', now, tostring(version), digits(token)}
end

redis.register_function{function_name = 'cronlock_v3_get', callback = get,
                        flags = {'no-writes'}}
redis.register_function('cronlock_v3_create', create)
redis.register_function('cronlock_v3_replace', replace)
"""
LIBRARY = (
    LIBRARY.replace("__LONGEST__", str(LONGEST_DURATION_SECONDS))
    .replace("__REFUSAL__", STORE_REFUSAL)
    .replace("__AHEAD__", str(TICK_AHEAD_SECONDS))
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

    def __init__(
        self,
        url: StoreUrl,
        now: Callable[[], datetime],
        timeout: float = 5.0,
        *,
        load_library: bool = True,
    ) -> None:
        """`load_library`: load the function library where it is missing, if the URL's user
        may (a reader such as `cronlock status` passes False and only says it is missing)."""
        self.url = url
        self.now = now
        self.load_library = load_library
        self.client: redis.Redis = redis.Redis.from_url(
            url.secret,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
            client_name="cronlock-sidecar",
        )
        # How long WAIT may block for the replicas: inside the socket's own timeout.
        self._wait_ms = max(100, int(timeout * 1000) - 500)
        self._lock = threading.Lock()

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        answer = self._call("get", "get", lease, [])
        reader_now = self.now()
        if answer[0] == "missing":
            raise NotFound("get", lease, f"no lock in {self.url}")
        _, store_now, document, version, fence, writer, written, renewed = answer
        body = to_reader(
            json.loads(document),
            writer_time=moment(writer),
            written_at=moment(written),
            store_now=moment(store_now),
            reader_now=reader_now,
            renewed_at=moment(renewed),
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
        writer_time = self.now()
        arguments = [
            json.dumps(document, separators=(",", ":")),
            micros(writer_time),
            str(int(renewal_age(document, writer_time).total_seconds() * 1_000_000)),
            str(IDLE_EXPIRY_MS),
            *extra,
        ]
        script = "create" if verb == "create" else "replace"
        answer = self._call(verb, script, lease, arguments, replicated=True)
        if answer[0] == "missing":
            raise NotFound(verb, lease, f"no lock in {self.url}")
        if answer[0] == "conflict":
            raise Conflict(verb, lease, "written by someone else since it was read")
        if answer[0] == "held":
            _, _store_now, holder, since, duration = answer
            raise Forbidden(verb, lease, held_refusal(holder, int(since), int(duration)))
        _, _store_now, version, fence = answer
        return stamped(document, version, fence)

    def _call(
        self,
        verb: str,
        script: str,
        lease: LeaseRef,
        arguments: list[str],
        *,
        replicated: bool = False,
    ) -> list[Any]:
        """The script's answer; for a write under `?replicas=N`, only once N replicas have
        it (Unavailable otherwise: the write stays on the primary, unconfirmed, and counts
        as not done, so a claim does not start the run and a renewal keeps its deadline)."""
        acked = None
        try:
            with self._lock:
                try:
                    answer, acked = self._send(script, lease, arguments, replicated)
                except redis.ResponseError as error:
                    if not _no_function(error):
                        raise
                    self._load(verb, lease)
                    answer, acked = self._send(script, lease, arguments, replicated)
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as error:
            raise Forbidden(verb, lease, f"{self.url}: {error}") from None
        except redis.ReadOnlyError as error:
            raise Unavailable(verb, lease, f"{self.url} is a read-only replica: {error}") from None
        except redis.ResponseError as error:
            if STORE_REFUSAL in str(error):
                raise Forbidden(verb, lease, f"{self.url} refused the write: {error}") from None
            raise Unavailable(verb, lease, f"{self.url}: {type(error).__name__}: {error}") from None
        except redis.RedisError as error:
            raise Unavailable(verb, lease, f"{self.url}: {type(error).__name__}: {error}") from None
        if not isinstance(answer, list) or not answer:
            raise Unavailable(verb, lease, f"{self.url}: unexpected answer {answer!r}")
        if acked is not None and acked < self.url.replicas and _wrote(answer):
            raise Unavailable(
                verb,
                lease,
                f"{self.url}: the write reached {acked} of the {self.url.replicas} replicas "
                f"asked for (replicas={self.url.replicas}) within {self._wait_ms} ms; it "
                f"does not count until they have it ({REPLICAS_DOCS})",
            )
        return answer

    def _send(
        self, script: str, lease: LeaseRef, arguments: list[str], replicated: bool
    ) -> tuple[Any, int | None]:
        """The function's answer, and under `?replicas=N` how many replicas have the write:
        the function and WAIT in one pipeline, since WAIT counts the replicas that have the
        writes of the connection it is sent on, and a pipeline is one connection (a WAIT
        sent after a reconnect would count none of the function's writes, and confirm)."""
        call = self.client.fcall_ro if script == "get" else self.client.fcall
        if not (replicated and self.url.replicas):
            return call(FUNCTIONS[script], 3, *keys(lease), *arguments), None
        with self.client.pipeline(transaction=False) as pipe:
            pipe.fcall(FUNCTIONS[script], 3, *keys(lease), *arguments)
            pipe.wait(self.url.replicas, self._wait_ms)
            answer, acked = pipe.execute()
        return answer, int(acked)

    def _load(self, verb: str, lease: LeaseRef) -> None:
        """The library loaded where it was missing, when this client may and its user is
        allowed FUNCTION LOAD; Forbidden, in one line saying what an admin does, if not."""
        if self.load_library:
            try:
                self.client.function_load(LIBRARY)
                return
            except redis.exceptions.NoPermissionError:
                pass
            except redis.ResponseError as refused:
                if "already exists" in str(refused):  # another sidecar loaded it meanwhile
                    return
                raise
        raise Forbidden(verb, lease, missing_library(str(self.url)))


def missing_library(url: str) -> str:
    """What a sidecar says when its Redis has no cronlock function library of its version."""
    return (
        f"{url} has no function library {LIBRARY_NAME} (Function not found); an admin loads "
        f"it once with FUNCTION LOAD ({LIBRARY_DOCS})"
    )


def _no_function(error: redis.ResponseError) -> bool:
    """FCALL's answer for a function no library has (in a pipeline, after the command)."""
    return str(error).endswith("Function not found")


def _wrote(answer: object) -> bool:
    return isinstance(answer, list) and bool(answer) and answer[0] == "ok"
