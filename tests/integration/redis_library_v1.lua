#!lua name=cronlock_v1
-- Version 1 as cronlock loaded it up to 07f05a4, without the tick records' rules; loaded
-- beside version 2 by tests/integration/test_store_ticks.py.
-- cronlock's lock rules (docs/STORES.md); KEYS: lease, version, fence.
local LONGEST = 86400
local LARGEST = 65536
local REFUSAL = 'cronlock store:'
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
          last = text(notes['cronlock.io/last-holder'])}
end
local function digits(value) return string.format('%.0f', value) end
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
  local old = parsed(v[2]) or {holder = '', duration = 0, job = '', last = ''}
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

redis.register_function{function_name = 'cronlock_v1_get', callback = get,
                        flags = {'no-writes'}}
redis.register_function('cronlock_v1_create', create)
redis.register_function('cronlock_v1_replace', replace)
