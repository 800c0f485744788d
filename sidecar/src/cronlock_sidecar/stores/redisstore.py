"""The lock in Redis (≥ 7) or Valkey: a Lease document per lock, written only by compare-and-set.

Each lock is four keys sharing one hash tag (so a Redis Cluster keeps them on one node):
`cronlock:{NS/NAME}:lease`, a hash with the Lease document as the sidecar writes it (on its
writer's clock), its version, its fencing token, the writer's and the store's clock at
the write, the store's time of the holder's last renewal and, per permit K ≥ 1, the
store's record of its holder's renewal and token; `…:version` and `…:fence`, counters
that only grow, and `…:fences`, the highest token handed out per permit. Every write is
one function of cronlock's Redis Function library (`LIBRARY`, called by FCALL), atomic
on the server: a create only where no lock is (SET NX's rule), a replace only of the
version the writer read, and both keep the lock's rules whatever the writer sends: each
permit's holder changes only on a free, expired (on Redis' clock), released or same-Job
hold, one holder holds one permit, a write claims one, N moves only while nothing is
held, durations are 1..86400 s, and the function alone sets the fencing tokens (one more
than any handed out on a new holder, unchanged otherwise; the counters keep the highest,
so a lock deleted by hand or lost in a failover is created again with higher ones) and
the times. Ages are judged on Redis' clock (`stores.frames`). An idle lock's hash expires
after a week; the counters stay.
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

from cronlock_sidecar.contract import MAX_PERMITS
from cronlock_sidecar.stores.documents import (
    STORE_REFUSAL,
    TICK_AHEAD_SECONDS,
    held_refusal,
    renewals_written,
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
LIBRARY_NAME = "cronlock_v4"
FUNCTIONS = {name: f"{LIBRARY_NAME}_{name}" for name in ("get", "create", "replace")}
LIBRARY_DOCS = 'docs/STORES.md, "Redis: the function library"'

# Each function's KEYS: lease, version, fence, fences. `now`: the store's time as one string
# of microseconds. `parsed`: the fields the rules read from a stored or written document
# (cjson, bundled with Redis' Lua); a document that does not parse, or is larger than any
# Lease (64 KiB: decoding a huge one would stall the server), reads as free (only a raw
# write by hand can store one). ARGV of the writes: document, writer's time (µs), how long
# before the writer's time the spec's renewTime is (µs; empty: this write renews no spec
# hold, so a holder's record is kept as it is), idle expiry (ms), for a replace the version
# read, and last the permits this write renews, `K=age` (µs) apart by spaces (a writer
# carrying another holder's entry names none, so its record is not moved). An age only
# ever makes the renewal older than the store's now. The writer's time only places the
# document's other moments (acquireTime, released-at) on readers' clocks; every age the
# rules or readers judge is the store's.
#
# The permits (lock/permits.py; docs/DECISIONS.md, "Permits in a store"): N is
# `cronlock.io/permits` read as Python reads a document's (digits alone, 1..16, else 1);
# permit 0 is the spec, permit K the entry `cronlock.io/permit.K`; entries at or beyond N
# are nobody's. A write may change N only while no permit below the old N is held and
# unexpired. Each permit's holder changes only on a free hold, an expired one (on the
# store's clock, for the shorter of its duration and the one the new holder writes), a
# release naming the holder (`cronlock.io/last-holder`), or an earlier pod of the same Job
# (the holder-job, or the entry's job field); else the answer is `held`, naming the permit.
# After the write no two permits below N name one holder, and at most one permit is
# claimed (a new holder, or a holder taking its own expired hold again): that claim's
# holder is the one the tick records may name, and the one permit released (holder to
# none, last-holder naming it) the holder whose success record a write may add.
#
# The store's own records: the spec's token and renewal as before (`fence`, `renewed`), and
# per permit K ≥ 1 `permit.K` = `<renewed µs> <token> <holder>` in the lease hash, valid
# only for the holder it names: a claim sets it (a new holder: the token one more than any
# handed out for K, whose highest `…:fences` keeps per K, so a lock deleted by hand or
# lost in a failover starts above it), the holder's renewal moves its time (never back),
# a release keeps it, and a write that changes N forgets the records at or beyond the new
# N (not the highest tokens). Readers get, per permit below N, the token and, for a held
# one, the renewal: an entry with no record of its holder reads as renewed long ago.
#
# The tick records (`cronlock.io/tick.<cronjob>`, lock/ticks.py) keep each tick at most
# once whoever writes (`ticks`; docs/STORES.md, "Tick records in a store"): only a claim
# adds or changes one, naming the claim's holder, never ahead of Redis' clock +
# TICK_AHEAD_SECONDS, never back to an older tick or to the same tick of another run; no
# write drops one. The success records (`cronlock.io/succeeded.<cronjob>`, `successes`;
# docs/STORES.md, "Success records in a store") are written only by the releasing
# holder's release (`run` whose command exited 0), each equal to that holder's own claim
# record of that CronJob, never back to an older tick; no write drops one. Version 2 of the
# library added the tick records, version 3 the success records, version 4 the permits:
# an older version keeps none of the newer rules, so it is deleted once no sidecar of the
# release before calls it (docs/UPGRADING.md).
LIBRARY = r"""#!lua name=cronlock_v4
-- cronlock's lock rules (docs/STORES.md); KEYS: lease, version, fence, fences.
local LONGEST = __LONGEST__
local LARGEST = 65536
local REFUSAL = '__REFUSAL__'
local TICKS = 'cronlock.io/tick.'
local SUCCEEDED = 'cronlock.io/succeeded.'
local PERMITS = 'cronlock.io/permits'
local PERMIT = 'cronlock.io/permit.'
local MOST = __MOST__
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
local EMPTY = {holder = '', duration = 0, job = '', last = '', notes = {}}
local function digits(value) return string.format('%.0f', value) end
local function refusal(why) return redis.error_reply(REFUSAL .. ' ' .. why) end
-- The lock's N as lock/permits.py reads a document's (`document_count`): digits alone,
-- 1..MOST, else 1.
local function count(notes)
  local value = notes[PERMITS]
  if type(value) ~= 'string' or not string.match(value, '^[1-9][0-9]?[0-9]?$')
     or tonumber(value) > MOST then
    return 1
  end
  return tonumber(value)
end
local FREE = {holder = '', job = ''}
-- Permit K's entry `<holder> <acquire> <renew> <duration s> <transitions> <job>` as
-- lock/permits.py reads it ('-' for none): its holder, duration and job; else free.
local function entry(value)
  if type(value) ~= 'string' then return FREE end
  local f = {}
  for field in string.gmatch(value .. ' ', '([^ ]*) ') do
    f[#f + 1] = field
    if #f > 6 then return FREE end
  end
  if #f ~= 6 then return FREE end
  for i = 1, 6 do
    if not string.match(f[i], '^[!-~]+$') or #f[i] > 253 then return FREE end
  end
  local duration = nil
  if string.match(f[4], '^[0-9]+$') and #f[4] <= 6 then duration = tonumber(f[4]) end
  return {holder = f[1] == '-' and '' or f[1], duration = duration,
          job = f[6] == '-' and '' or f[6]}
end
-- Permits 0..n-1 of a parsed document: the spec, then the entries.
local function holds(lease, n)
  local list = {[0] = {holder = lease.holder, duration = lease.duration, job = lease.job}}
  for k = 1, n - 1 do list[k] = entry(lease.notes[PERMIT .. k]) end
  return list
end
local function lasting(hold)
  return math.min(math.max(tonumber(hold.duration) or 0, 0), LONGEST)
end
local FIELDS, NUMBERS = {}, {}
for k = 1, MOST - 1 do FIELDS[k] = 'permit.' .. k; NUMBERS[k] = '' .. k end
-- The store's records of permits 1..MOST-1 (`<renewed µs> <token> <holder>`), raw and read.
local function records(key)
  local raw = redis.call('HMGET', key, unpack(FIELDS))
  local found = {}
  for k = 1, MOST - 1 do
    local renewed, token, holder = string.match(text(raw[k]), '^(%d+) (%d+) (.*)$')
    if renewed then
      found[k] = {renewed = tonumber(renewed), token = tonumber(token), holder = holder}
    end
  end
  return raw, found
end
-- What readers get of permits 1..n-1: K, the renewal (held: its holder's record) and the
-- token, as strings.
local function answered(list, n, found, now_us)
  local out = {}
  for k = 1, n - 1 do
    local rec = found[k]
    if rec then
      local renewed = ''
      if list[k].holder ~= '' then
        if rec.holder ~= list[k].holder then rec = nil
        elseif rec.renewed <= now_us then renewed = digits(rec.renewed) end
      end
      if rec then
        out[#out + 1] = NUMBERS[k]; out[#out + 1] = renewed; out[#out + 1] = digits(rec.token)
      end
    end
  end
  return out
end
local function ages(value)
  local found = {}
  if type(value) ~= 'string' or #value > 1024 then return found end
  for k, age in string.gmatch(value, '(%d+)=(%d+)') do found[tonumber(k)] = tonumber(age) end
  return found
end
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
-- holder (`claimant`, '' when the write claims nothing), is not ahead of the store's clock +
-- AHEAD, and is not older than (nor the same tick of another run as) the record it
-- replaces, unless that one is ahead (nobody's); no write drops one. An error reply, or nil.
local function ticks(old_notes, new_notes, claimant, now_us)
  local function refused(key, why)
    return redis.error_reply(REFUSAL .. ' tick record ' .. key .. ': ' .. why)
  end
  for key, value in pairs(old_notes) do
    if tick_key(key) and type(value) == 'string' and type(new_notes[key]) ~= 'string' then
      return refused(key, 'every write carries it (a claim may replace it, none drops it)')
    end
  end
  local latest = math.floor(now_us / 1000000) + AHEAD
  for key, value in pairs(new_notes) do
    if tick_key(key) and type(value) == 'string' and old_notes[key] ~= value then
      if claimant == '' then
        return refused(key, 'only a claim (a new holder) writes one; a renewal or a release '
                            .. 'carries each unchanged')
      end
      local mine = record(value)
      if not mine then
        return refused(key, 'not <tick> <job|-> <run> <holder> <cluster|->, the tick in '
                            .. 'RFC 3339 whole seconds (2026-12-06T12:00:00Z)')
      end
      if mine.holder ~= claimant then
        return refused(key, "it names holder " .. mine.holder .. ", not the claim's "
                            .. claimant)
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
-- The success records' rules: a record is added or changed only by a holder's release
-- (`releasing`: the holder of the one permit the write gives back, last-holder naming it;
-- '' when none), equal to that holder's own claim record of the same CronJob, and not
-- older than the recorded success unless that one is ahead (nobody's); no write drops
-- one. An error reply, or nil.
local function successes(old_notes, new_notes, releasing, now_us)
  local function refused(key, why)
    return redis.error_reply(REFUSAL .. ' success record ' .. key .. ': ' .. why)
  end
  for key, value in pairs(old_notes) do
    if success_key(key) and type(value) == 'string' and type(new_notes[key]) ~= 'string' then
      return refused(key, "every write carries it (the holder's release may move it, none "
                          .. 'drops it)')
    end
  end
  local latest = math.floor(now_us / 1000000) + AHEAD
  for key, value in pairs(new_notes) do
    if success_key(key) and type(value) == 'string' and old_notes[key] ~= value then
      if releasing == '' then
        return refused(key, "only the holder's release writes one")
      end
      local claim = old_notes[TICKS .. string.sub(key, #SUCCEEDED + 1)]
      local mine = record(claim)
      if not mine or value ~= claim or mine.holder ~= releasing then
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
-- The written document, or an error reply.
local function checked(args)
  local new = parsed(args[1])
  if not new then
    return nil, refusal('the document is not a JSON object of at most ' .. LARGEST .. ' bytes')
  end
  local d = new.duration
  -- A document with no holder may have no duration (a freeze on a lock never taken).
  if (new.holder ~= '' or d ~= nil)
     and (type(d) ~= 'number' or d ~= math.floor(d) or d < 1 or d > LONGEST) then
    return nil, refusal('leaseDurationSeconds must be a whole number from 1 to ' .. LONGEST)
  end
  return new, nil
end
-- The permit rules for a write of `new` over `old` (EMPTY for a create), `renewing` the
-- permits it renews ([0] the spec): the judgement, or an answer refusing it (`held`, or an
-- error reply).
local function judged(old, new, now, now_us, renewed, found, renewing)
  local old_n, new_n = count(old.notes), count(new.notes)
  local olds, news = holds(old, old_n), holds(new, new_n)
  for k = 1, new_n - 1 do
    local d = news[k].duration
    if news[k].holder ~= '' and (not d or d < 1 or d > LONGEST) then
      return nil, refusal(PERMIT .. k .. ': a held permit lasts a whole number of seconds '
                          .. 'from 1 to ' .. LONGEST)
    end
  end
  -- How long ago each permit below the old N was renewed, on the store's clock (an entry
  -- with no record of its holder: long ago).
  local since = {[0] = now_us - renewed}
  for k = 1, old_n - 1 do
    local rec = found[k]
    if rec and rec.holder == olds[k].holder and rec.renewed <= now_us then
      since[k] = now_us - rec.renewed
    else
      since[k] = now_us
    end
  end
  if new_n ~= old_n then
    for k = 0, old_n - 1 do
      if olds[k].holder ~= '' and since[k] <= lasting(olds[k]) * 1000000 then
        return nil, refusal(PERMITS .. ' changes only while no permit of the lock is held: '
                            .. 'permit ' .. k .. ' of ' .. old_n .. ' is held by '
                            .. olds[k].holder)
      end
    end
  end
  local claims, seen = {}, {}
  local judgement = {olds = olds, news = news, new_n = new_n, claimed = {}, claimant = '',
                     releasing = ''}
  for k = 0, new_n - 1 do
    local o, n = olds[k] or FREE, news[k]
    local ago = since[k] or now_us
    local lasts = lasting(o)
    if n.holder ~= '' then lasts = math.min(lasts, tonumber(n.duration) or 0) end
    local expired = ago > lasts * 1000000
    local prefix = string.sub(o.job .. '-', 1, 58)
    local allowed = o.holder == '' or n.holder == o.holder
      or (n.holder == '' and new.last == o.holder)
      or expired
      or (o.job ~= '' and n.holder ~= '' and n.job == o.job
          and string.sub(n.holder, 1, #prefix) == prefix)
    if not allowed then
      return nil, {'held', now, o.holder, digits(ago), digits(lasting(o)), NUMBERS[k] or '0'}
    end
    -- A claim: a new holder, or the holder renewing its own expired hold (carrying it
    -- unrenewed, as another permit's holder does, is none).
    if n.holder ~= '' and (n.holder ~= o.holder or (expired and renewing[k])) then
      claims[#claims + 1] = k
      judgement.claimed[k] = true
      judgement.claimant = n.holder
    end
    if o.holder ~= '' and n.holder == '' and new.last == o.holder then
      judgement.releasing = o.holder
    end
    if n.holder ~= '' then
      if seen[n.holder] then
        return nil, refusal('permits ' .. seen[n.holder] .. ' and ' .. k .. ' would both be '
                            .. 'held by ' .. n.holder .. '; a holder holds one permit')
      end
      seen[n.holder] = k
    end
  end
  if #claims > 1 then
    return nil, refusal('a write claims one permit at most; this one claims permits '
                        .. table.concat(claims, ' and '))
  end
  return judgement, nil
end
-- The write itself: the document, the spec's token and renewal (a create's are set), and
-- each permit's records.
local function write(keys, args, judgement, now, now_us, spec, raw, found, renewing)
  local olds, news = judgement.olds, judgement.news
  local function renewal(k) return math.max(0, now_us - math.max(renewing[k] or 0, 0)) end
  local token, renewed = spec.token, spec.renewed
  if not spec.created then
    local fence = tonumber(redis.call('GET', keys[3]) or '0') or 0
    if news[0].holder ~= '' and news[0].holder ~= olds[0].holder then
      token = math.max(token, fence) + 1
      renewed = renewal(0)
    elseif judgement.claimed[0] then
      renewed = renewal(0)
    elseif news[0].holder ~= '' and renewing[0] then
      renewed = math.max(renewal(0), renewed)
    end
    if token > fence then redis.call('SET', keys[3], digits(token)) end
  end
  local version = redis.call('INCR', keys[2])
  local fields = {'doc', args[1], 'version', version, 'fence', digits(token),
                  'writer', args[2], 'written', now, 'renewed', digits(renewed)}
  local top = redis.call('HMGET', keys[4], unpack(NUMBERS))
  local after = {}
  for k = 1, MOST - 1 do
    local rec, o, n = found[k], olds[k] or FREE, news[k]
    if k >= judgement.new_n then
      rec = nil  -- no permit of the lock any more: forgotten
    elseif n.holder ~= '' and (n.holder ~= o.holder or not rec or rec.holder ~= n.holder) then
      if judgement.claimed[k] then  -- a new holder: the next token for permit K
        local highest = tonumber(top[k] or '0') or 0
        local next_token = math.max(rec and rec.token or 0, highest) + 1
        redis.call('HSET', keys[4], NUMBERS[k], digits(next_token))
        rec = {renewed = renewal(k), token = next_token, holder = n.holder}
      end
    elseif n.holder ~= '' and judgement.claimed[k] then  -- its own expired hold again
      rec = {renewed = renewal(k), token = rec.token, holder = n.holder}
    elseif n.holder ~= '' and renewing[k] then
      rec = {renewed = math.max(rec.renewed, renewal(k)), token = rec.token, holder = n.holder}
    end
    local value = ''
    if rec then value = digits(rec.renewed) .. ' ' .. digits(rec.token) .. ' ' .. rec.holder end
    if value ~= text(raw[k]) then
      fields[#fields + 1] = FIELDS[k]
      fields[#fields + 1] = value
    end
    after[k] = rec
  end
  redis.call('HSET', keys[1], unpack(fields))
  redis.call('PEXPIRE', keys[1], args[4])
  return {'ok', now, tostring(version), digits(token),
          answered(news, judgement.new_n, after, now_us)}
end

local function get(keys, args)
  local now, now_us = clock()
  local v = redis.call('HMGET', keys[1], 'doc', 'version', 'fence', 'writer', 'written',
                       'renewed')
  if not v[1] then return {'missing', now} end
  local lease = parsed(v[1]) or EMPTY
  local n = count(lease.notes)
  local _, found = records(keys[1])
  return {'ok', now, v[1], v[2], v[3], v[4], v[5], v[6] or v[5],
          answered(holds(lease, n), n, found, now_us)}
end

local function create(keys, args)
  local now, now_us = clock()
  local new, refused = checked(args)
  if refused then return refused end
  if redis.call('EXISTS', keys[1]) == 1 then return {'conflict', now} end
  local renewing = ages(args[5])
  renewing[0] = tonumber(args[3])
  local judgement
  judgement, refused = judged(EMPTY, new, now, now_us, 0, {}, renewing)
  if refused then return refused end
  refused = ticks({}, new.notes, judgement.claimant, now_us)
    or successes({}, new.notes, '', now_us)
  if refused then return refused end
  local spec = {created = true, token = redis.call('INCR', keys[3]),
                renewed = math.max(0, now_us - math.max(renewing[0] or 0, 0))}
  return write(keys, args, judgement, now, now_us, spec, {}, {}, renewing)
end

local function replace(keys, args)
  local now, now_us = clock()
  local new, refused = checked(args)
  if refused then return refused end
  local v = redis.call('HMGET', keys[1], 'version', 'doc', 'fence', 'renewed', 'written')
  if not v[1] then return {'missing', now} end
  if v[1] ~= args[5] then return {'conflict', now} end
  local old = parsed(v[2]) or EMPTY
  local renewed = tonumber(v[4] or v[5] or '0') or 0
  if renewed > now_us then renewed = 0 end  -- a time the store never wrote
  local renewing = ages(args[6])
  renewing[0] = tonumber(args[3])
  local raw, found = records(keys[1])
  local judgement
  judgement, refused = judged(old, new, now, now_us, renewed, found, renewing)
  if refused then return refused end
  refused = ticks(old.notes, new.notes, judgement.claimant, now_us)
    or successes(old.notes, new.notes, judgement.releasing, now_us)
  if refused then return refused end
  local spec = {created = false, token = tonumber(v[3]) or 0, renewed = renewed}
  return write(keys, args, judgement, now, now_us, spec, raw, found, renewing)
end

redis.register_function{function_name = 'cronlock_v4_get', callback = get,
                        flags = {'no-writes'}}
redis.register_function('cronlock_v4_create', create)
redis.register_function('cronlock_v4_replace', replace)
"""
LIBRARY = (
    LIBRARY.replace("__LONGEST__", str(LONGEST_DURATION_SECONDS))
    .replace("__REFUSAL__", STORE_REFUSAL)
    .replace("__AHEAD__", str(TICK_AHEAD_SECONDS))
    .replace("__MOST__", str(MAX_PERMITS))
)


def keys(lease: LeaseRef) -> list[str]:
    tag = "{" + str(lease) + "}"
    return [
        f"cronlock:{tag}:lease",
        f"cronlock:{tag}:version",
        f"cronlock:{tag}:fence",
        f"cronlock:{tag}:fences",
    ]


def micros(moment: datetime) -> str:
    return str(int(moment.timestamp() * 1_000_000))


def moment(text: str) -> datetime:
    return datetime.fromtimestamp(int(text) / 1_000_000, UTC)


def permit_records(answer: object) -> tuple[dict[int, datetime], dict[int, int]]:
    """The library's records of permits K ≥ 1 (`K, renewed µs or "", token` in a row): the
    store's renewal of each held permit, and each permit's token."""
    fields = [str(field) for field in answer] if isinstance(answer, list) else []
    renewals: dict[int, datetime] = {}
    tokens: dict[int, int] = {}
    for index in range(0, len(fields) - 2, 3):
        number, renewed, token = fields[index : index + 3]
        tokens[int(number)] = int(token)
        if renewed:
            renewals[int(number)] = moment(renewed)
    return renewals, tokens


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
        # The document each lock was last read or written as here: a write built on it
        # renews only what it changed (`renewals_written`), so carrying another holder's
        # permit does not move that holder's renewal.
        self._known: dict[LeaseRef, Lease] = {}

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        answer = self._call("get", "get", lease, [])
        reader_now = self.now()
        if answer[0] == "missing":
            raise NotFound("get", lease, f"no lock in {self.url}")
        _, store_now, document, version, fence, writer, written, renewed, permits = answer
        renewals, tokens = permit_records(permits)
        body = to_reader(
            json.loads(document),
            writer_time=moment(writer),
            written_at=moment(written),
            store_now=moment(store_now),
            reader_now=reader_now,
            renewed_at=moment(renewed),
            permit_renewals=renewals,
        )
        return self._remember(lease, stamped(body, version, fence, permit_tokens=tokens))

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
        with self._lock:
            known = self._known.get(lease)
        if known is not None and version_read(known) != version_read(body):
            known = None  # built on another read: every hold it names counts as renewed
        spec_age, permit_ages = renewals_written(document, known, writer_time)
        arguments = [
            json.dumps(document, separators=(",", ":")),
            micros(writer_time),
            "" if spec_age is None else str(int(spec_age.total_seconds() * 1_000_000)),
            str(IDLE_EXPIRY_MS),
            *extra,
            " ".join(
                f"{index}={int(age.total_seconds() * 1_000_000)}"
                for index, age in sorted(permit_ages.items())
            ),
        ]
        script = "create" if verb == "create" else "replace"
        answer = self._call(verb, script, lease, arguments, replicated=True)
        if answer[0] == "missing":
            raise NotFound(verb, lease, f"no lock in {self.url}")
        if answer[0] == "conflict":
            raise Conflict(verb, lease, "written by someone else since it was read")
        if answer[0] == "held":
            _, _store_now, holder, since, duration, permit = answer
            refusal = held_refusal(holder, int(since), int(duration), permit=int(permit))
            raise Forbidden(verb, lease, refusal)
        _, _store_now, version, fence, permits = answer
        _, tokens = permit_records(permits)
        return self._remember(lease, stamped(document, version, fence, permit_tokens=tokens))

    def _remember(self, lease: LeaseRef, document: Lease) -> Lease:
        with self._lock:
            self._known[lease] = document
        return document

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
        named = keys(lease)
        if not (replicated and self.url.replicas):
            return call(FUNCTIONS[script], len(named), *named, *arguments), None
        with self.client.pipeline(transaction=False) as pipe:
            pipe.fcall(FUNCTIONS[script], len(named), *named, *arguments)
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
