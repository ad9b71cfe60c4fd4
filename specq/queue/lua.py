"""The Lua scripts that make every state change atomic inside Redis.

A request's state, the per-state counts and the running set change together, in
one script, so a kill between two writes cannot leave them disagreeing. Every write
a worker makes about a request it decodes is fenced: the lease key holds
"owner#token" with a token from a per-request counter that only grows, and a write
is refused unless the lease still holds exactly the writer's value (Kleppmann, "How
to do distributed locking", 2016). A worker that was only stalled, whose lease
expired and whose request was taken over, can therefore never overwrite the new
owner's checkpoint.
"""

from __future__ import annotations

# set_state(state_key, counts_key, rid, new): keeps the per-state counts exact.
_SET_STATE = """
local function set_state(state_key, counts_key, rid, new)
  local old = redis.call('HGET', state_key, rid)
  if old == new then return end
  if old then redis.call('HINCRBY', counts_key, old, -1) end
  redis.call('HSET', state_key, rid, new)
  redis.call('HINCRBY', counts_key, new, 1)
end
local function add_stats(stats_key, rate_key, deltas_json, now)
  local deltas = cjson.decode(deltas_json)
  local total = nil
  for field, value in pairs(deltas) do
    if value ~= 0 then
      local v = redis.call('HINCRBYFLOAT', stats_key, field, value)
      if field == 'tokens' then total = v end
    end
  end
  if total then
    redis.call('LPUSH', rate_key, now .. ' ' .. total)
    redis.call('LTRIM', rate_key, 0, 299)
  end
end
"""

# KEYS: state counts running fence flags req_flags pending lease_prefix(ARGV)
# ARGV: owner ttl_ms lease_prefix
# Pops pending requests until one can be claimed; returns {rid, token} or {} when
# the pending list is empty. Requests found paused or cancelled (by flag) are moved
# to that state; finished, leased or unknown ones are skipped.
CLAIM = (
    _SET_STATE
    + """
local state_key, counts_key, running_key, fence_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local flags_key, req_flags_key, pending_key = KEYS[5], KEYS[6], KEYS[7]
local owner, ttl, lease_prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local batch_flag = redis.call('HGET', flags_key, 'cancelled') and 'cancelled'
  or (redis.call('HGET', flags_key, 'paused') and 'paused')
while true do
  local rid = redis.call('LPOP', pending_key)
  if not rid then return {} end
  local st = redis.call('HGET', state_key, rid)
  if st == 'queued' then
    local flag = batch_flag or redis.call('HGET', req_flags_key, rid)
    local lease = lease_prefix .. rid
    if flag == 'cancelled' or flag == 'paused' then
      set_state(state_key, counts_key, rid, flag)
    elseif redis.call('EXISTS', lease) == 0 then
      local token = redis.call('HINCRBY', fence_key, rid, 1)
      redis.call('SET', lease, owner .. '#' .. token, 'PX', ttl)
      set_state(state_key, counts_key, rid, 'running')
      redis.call('SADD', running_key, rid)
      return {rid, tostring(token)}
    end
  end
end
"""
)

# KEYS: lease... ; ARGV: ttl_ms value...  -> list of 1 (renewed) / 0 (lost)
RENEW = """
local ttl = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ttl)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# KEYS: lease ckpt stats rate attempts ; ARGV: value rid checkpoint ttl_ms now deltas_json
# A checkpoint is progress (a worker writes one only after rounds that emitted
# tokens), so it clears the request's count of attempts: what makes a request a
# poison one is failing again and again from the same checkpoint. A request that
# only shared a worker with others when it was killed (a preemption, a crash caused
# by another request) moves on between kills and is never failed for them.
CHECKPOINT = (
    _SET_STATE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HDEL', KEYS[5], ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
add_stats(KEYS[3], KEYS[4], ARGV[6], ARGV[5])
return 1
"""
)

# The owner lets go of a request: completed (with its result), failed (with its
# error), or back to paused / cancelled / queued with its last checkpoint.
# KEYS: lease state counts running ckpt result error stats rate pending
# ARGV: value rid new_state payload now deltas_json
SETTLE = (
    _SET_STATE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local rid, new, payload = ARGV[2], ARGV[3], ARGV[4]
set_state(KEYS[2], KEYS[3], rid, new)
redis.call('SREM', KEYS[4], rid)
redis.call('DEL', KEYS[1])
if new == 'completed' then
  redis.call('HSET', KEYS[6], rid, payload)
  redis.call('HDEL', KEYS[5], rid)
  redis.call('HDEL', KEYS[7], rid)
elseif new == 'failed' then
  redis.call('HSET', KEYS[7], rid, payload)
elseif payload ~= '' then
  redis.call('HSET', KEYS[5], rid, payload)
end
if new == 'queued' then redis.call('LPUSH', KEYS[10], rid) end
add_stats(KEYS[8], KEYS[9], ARGV[6], ARGV[5])
return 1
"""
)

# A running request whose lease is gone was abandoned (its worker died or stalled):
# back to the pending list, or failed once it has been abandoned too often since its
# last checkpoint.
# KEYS: state counts running lease attempts error pending stats
# ARGV: rid max_attempts error_json
# Returns 0 (not abandoned), 1 (requeued), 2 (failed).
REAP = (
    _SET_STATE
    + """
local rid = ARGV[1]
if redis.call('HGET', KEYS[1], rid) ~= 'running' then
  redis.call('SREM', KEYS[3], rid)
  return 0
end
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
redis.call('SREM', KEYS[3], rid)
redis.call('HINCRBY', KEYS[8], 'resumes_crash', 1)
if redis.call('HINCRBY', KEYS[5], rid, 1) > tonumber(ARGV[2]) then
  set_state(KEYS[1], KEYS[2], rid, 'failed')
  redis.call('HINCRBY', KEYS[8], 'failed_abandoned', 1)
  redis.call('HSET', KEYS[6], rid, ARGV[3])
  return 2
end
set_state(KEYS[1], KEYS[2], rid, 'queued')
redis.call('RPUSH', KEYS[7], rid)
return 1
"""
)

# Move requests that are in one of the `from` states to `to` (pause, resume, cancel
# of requests no worker holds). KEYS: state counts pending error
# ARGV: from_csv to push_pending(0/1) rid...  -> the ids that moved
TRANSITION = (
    _SET_STATE
    + """
local allowed = {}
for s in string.gmatch(ARGV[1], '[^,]+') do allowed[s] = true end
local to, push = ARGV[2], ARGV[3] == '1'
local moved = {}
for i = 4, #ARGV do
  local rid = ARGV[i]
  local st = redis.call('HGET', KEYS[1], rid)
  if st and allowed[st] then
    set_state(KEYS[1], KEYS[2], rid, to)
    if to == 'queued' then redis.call('HDEL', KEYS[4], rid) end
    if push then redis.call('RPUSH', KEYS[3], rid) end
    moved[#moved + 1] = rid
  end
end
return moved
"""
)

# Compare-and-delete: drop a lease only if it still holds the value seen (its owner
# is known dead), so a lease renewed or retaken meanwhile is left alone.
DELETE_IF = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Forget a finished request of a synchronous batch, once its answer was delivered:
# every record of it goes, and the counts stay exact. A request not yet finished is
# left alone. KEYS: state counts ids spec ckpt result error attempts fence req_flags
FORGET = """
local rid = ARGV[1]
local st = redis.call('HGET', KEYS[1], rid)
if st ~= 'completed' and st ~= 'failed' and st ~= 'cancelled' then return 0 end
redis.call('HDEL', KEYS[1], rid)
redis.call('HINCRBY', KEYS[2], st, -1)
redis.call('LREM', KEYS[3], 1, rid)
for i = 4, #KEYS do redis.call('HDEL', KEYS[i], rid) end
return 1
"""
