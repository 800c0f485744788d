#!lua name=cronlock_v3
-- Version 3 as cronlock loaded it up to 77cdcec, without the permits' rules; loaded
-- beside version 4 by tests/integration/test_redis_tenants.py.
-- cronlock's lock rules (docs/STORES.md); KEYS: lease, version, fence.
local LONGEST = 86400
local LARGEST = 65536
local REFUSAL = 'cronlock store:'
local TICKS = 'cronlock.io/tick.'
local SUCCEEDED = 'cronlock.io/succeeded.'
local AHEAD = 60
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
