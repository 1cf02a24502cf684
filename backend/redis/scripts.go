package redis

import goredis "github.com/redis/go-redis/v9"

// Every state change is one of these scripts. Each one reads the server's
// clock with TIME, so leases and schedules never depend on the clocks of the
// worker machines. Times are Unix milliseconds. The scripts batch their
// commands (one RPOP, HMGET, HSET, ZADD per claim; one HMGET, ZREM, HDEL per
// batch of acks), since each redis.call costs about a microsecond of the
// server's single thread.
//
// Key order, shared by all scripts (see Backend.keys); the hot ones get only
// the leading keys they use, as Redis builds the KEYS table on every call:
//
//	KEYS[1] ready   KEYS[2] sched   KEYS[3] inflight  KEYS[4] jobs
//	KEYS[5] signal  KEYS[6] seq     KEYS[7] dead      KEYS[8] held
//	KEYS[9] heldrec KEYS[10] deadrm
//
// The jobs hash holds, for copy id, the field id (the body) and the field
// "m:"..id (the lease meta "<deliveries>:<deadline ms>:<token>", absent
// until the first claim). The meta decides whether a receipt still holds its
// lease: its token must match and its deadline must not have passed. The
// inflight zset holds the same deadline, for the reaper.
const (
	luaNow = `
local function now_ms()
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), us
end
local function ms(x)
  return string.format('%d', x)
end
`
	luaWake = `
local function wake()
  if redis.call('LLEN', KEYS[5]) == 0 then
    redis.call('LPUSH', KEYS[5], '1')
  end
end
`
	// held returns the delivery count of copy id when it is leased under
	// token tok and the lease has not run out, else nil. forget removes
	// every trace of copy id but its place in a list.
	luaHeld = `
local function held(id, tok, now)
  local m = redis.call('HGET', KEYS[4], 'm:' .. id)
  if not m then return nil end
  local c, dl, t = string.match(m, '^(%d+):(%d+):(.*)$')
  if t ~= tok or tonumber(dl) < now then return nil end
  return c
end
local function forget(id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id, 'm:' .. id, 'r:' .. id)
end
`
	// store writes a new copy with body b, due at nb (ms; 0 or past means
	// now), and the time it is ready from, "r:"..id, for Stats.
	luaStore = `
local function store(now, nb, b)
  local id = redis.call('INCR', KEYS[6])
  redis.call('HSET', KEYS[4], id, b, 'r:' .. id, ms(math.max(nb, now)))
  if nb > now then
    redis.call('ZADD', KEYS[2], ms(nb), id)
  else
    redis.call('LPUSH', KEYS[1], id)
  end
end
`
)

// enqueueScript stores copies. ARGV: pairs of (not-before ms, body).
var enqueueScript = goredis.NewScript(luaNow + luaWake + luaStore + `
local now = now_ms()
for i = 1, #ARGV, 2 do
  store(now, tonumber(ARGV[i]), ARGV[i + 1])
end
wake()
return #ARGV / 2
`)

// claimScript hands out up to ARGV[1] jobs under a lease of ARGV[2] ms with
// tokens ARGV[3]..n, counting each delivery, and sweeps: it returns expired
// leases to ready (the reaper) and promotes due scheduled jobs. It sweeps
// whenever ready alone cannot fill the claim, and otherwise on one claim in
// eight (by the server clock's microseconds), so a busy queue saves the
// sweep's commands while a due job still moves within a few claims. It
// returns {wait, id, count, token, body, ...}; wait is, when nothing was
// claimed, the milliseconds until the next scheduled job or lease deadline
// (-1: none).
var claimScript = goredis.NewScript(luaNow + luaWake + `
local now, us = now_ms()
local max = tonumber(ARGV[1])
local ids = redis.call('RPOP', KEYS[1], max) or {}
if #ids < max or us % 8 == 0 then
  local moved = false
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ms(now - 1), 'LIMIT', 0, 1000)
  if #expired > 0 then
    redis.call('ZREM', KEYS[3], unpack(expired))
    redis.call('LPUSH', KEYS[1], unpack(expired))
    moved = true
  end
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ms(now), 'LIMIT', 0, 1000)
  if #due > 0 then
    redis.call('ZREM', KEYS[2], unpack(due))
    redis.call('LPUSH', KEYS[1], unpack(due))
    moved = true
  end
  if moved and #ids < max then
    local more = redis.call('RPOP', KEYS[1], max - #ids)
    if more then
      for _, id in ipairs(more) do ids[#ids + 1] = id end
    end
  end
end
local out = {0}
local n = 0
if #ids > 0 then
  local fields = {}
  for i, id in ipairs(ids) do
    fields[2 * i - 1] = id
    fields[2 * i] = 'm:' .. id
  end
  local vals = redis.call('HMGET', KEYS[4], unpack(fields))
  local dl = ms(now + tonumber(ARGV[2]))
  local metas, zs = {}, {}
  for i, id in ipairs(ids) do
    local body = vals[2 * i - 1]
    if body then
      local c = 1
      if vals[2 * i] then
        c = tonumber(string.match(vals[2 * i], '^(%d+):')) + 1
      end
      n = n + 1
      local tok = ARGV[3] .. n
      metas[#metas + 1] = fields[2 * i]
      metas[#metas + 1] = c .. ':' .. dl .. ':' .. tok
      zs[#zs + 1] = dl
      zs[#zs + 1] = id
      out[#out + 1] = id
      out[#out + 1] = c
      out[#out + 1] = tok
      out[#out + 1] = body
    end
  end
  if n > 0 then
    redis.call('HSET', KEYS[4], unpack(metas))
    redis.call('ZADD', KEYS[3], unpack(zs))
  end
end
-- A full claim may have left work behind: tell an idle receiver. (A claim
-- short of max emptied ready.)
if #ids == max then
  wake()
end
if n == 0 then
  local nextAt = -1
  local s = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if s[2] then nextAt = tonumber(s[2]) end
  local f = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if f[2] and (nextAt < 0 or tonumber(f[2]) < nextAt) then nextAt = tonumber(f[2]) end
  if nextAt >= 0 then
    local w = nextAt - now + 1
    if w < 0 then w = 0 end
    out[1] = w
  else
    out[1] = -1
  end
end
return out
`)

// ackScript removes the copies ARGV[1], ARGV[3], ... leased under tokens
// ARGV[2], ARGV[4], ... It returns one number per copy: 1, or 0 when its
// lease is lost.
var ackScript = goredis.NewScript(luaNow + `
local now = now_ms()
local n = #ARGV / 2
local fields = {}
for i = 1, n do fields[i] = 'm:' .. ARGV[2 * i - 1] end
local metas = redis.call('HMGET', KEYS[4], unpack(fields))
local out, zrem, hdel = {}, {}, {}
for i = 1, n do
  out[i] = 0
  if metas[i] then
    local dl, t = string.match(metas[i], '^%d+:(%d+):(.*)$')
    if t == ARGV[2 * i] and tonumber(dl) >= now then
      out[i] = 1
      zrem[#zrem + 1] = ARGV[2 * i - 1]
      hdel[#hdel + 1] = ARGV[2 * i - 1]
      hdel[#hdel + 1] = fields[i]
      hdel[#hdel + 1] = 'r:' .. ARGV[2 * i - 1]
    end
  end
end
if #zrem > 0 then
  redis.call('ZREM', KEYS[3], unpack(zrem))
  redis.call('HDEL', KEYS[4], unpack(hdel))
end
return out
`)

// extendScript renews the lease of copy ARGV[1] under token ARGV[2] to
// ARGV[3] ms from now. Returns 1, or 0 when the lease is lost.
var extendScript = goredis.NewScript(luaNow + luaHeld + `
local now = now_ms()
local c = held(ARGV[1], ARGV[2], now)
if not c then return 0 end
local dl = ms(now + tonumber(ARGV[3]))
redis.call('HSET', KEYS[4], 'm:' .. ARGV[1], c .. ':' .. dl .. ':' .. ARGV[2])
redis.call('ZADD', KEYS[3], 'XX', dl, ARGV[1])
return 1
`)

// requeueScript replaces copy ARGV[1] leased under token ARGV[2] with a new
// copy: body ARGV[4], due at ARGV[3] ms, delivery count zero. Returns 1, or 0
// when the lease is lost.
var requeueScript = goredis.NewScript(luaNow + luaWake + luaHeld + luaStore + `
local now = now_ms()
if not held(ARGV[1], ARGV[2], now) then return 0 end
forget(ARGV[1])
store(now, tonumber(ARGV[3]), ARGV[4])
wake()
return 1
`)

// deadLetterScript removes copy ARGV[1] leased under token ARGV[2] and
// appends record ARGV[3] to the dead list. Returns 1, or 0 when the lease is
// lost.
var deadLetterScript = goredis.NewScript(luaNow + luaHeld + `
local now = now_ms()
if not held(ARGV[1], ARGV[2], now) then return 0 end
forget(ARGV[1])
redis.call('RPUSH', KEYS[7], ARGV[3])
return 1
`)

// restoreHeld is the part of the dead-letter scripts that puts records whose
// holder vanished back at the head of the dead list.
const restoreHeld = `
local function restore(now)
  local ex = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', ms(now - 1))
  for i = #ex, 1, -1 do
    local rec = redis.call('HGET', KEYS[9], ex[i])
    redis.call('ZREM', KEYS[8], ex[i])
    redis.call('HDEL', KEYS[9], ex[i])
    if rec then redis.call('LPUSH', KEYS[7], rec) end
  end
end
`

// nextDeadScript restores expired holds, then pops the oldest record and
// holds it under token ARGV[1] for ARGV[2] ms. Returns the record or nil.
var nextDeadScript = goredis.NewScript(luaNow + restoreHeld + `
local now = now_ms()
restore(now)
local rec = redis.call('LPOP', KEYS[7])
if not rec then return false end
redis.call('HSET', KEYS[9], ARGV[1], rec)
redis.call('ZADD', KEYS[8], ms(now + tonumber(ARGV[2])), ARGV[1])
return rec
`)

// settleDeadScript releases the record held under token ARGV[1]: ARGV[2] "1"
// drops it, "0" puts it back at the head. Returns 1, or 0 when the hold was
// lost (an expired hold is put back).
var settleDeadScript = goredis.NewScript(luaNow + `
local now = now_ms()
local rec = redis.call('HGET', KEYS[9], ARGV[1])
local dl = redis.call('ZSCORE', KEYS[8], ARGV[1])
if not rec or not dl then return 0 end
redis.call('ZREM', KEYS[8], ARGV[1])
redis.call('HDEL', KEYS[9], ARGV[1])
if tonumber(dl) < now then
  redis.call('LPUSH', KEYS[7], rec)
  return 0
end
if ARGV[2] == '0' then
  redis.call('LPUSH', KEYS[7], rec)
end
return 1
`)

// extendDeadScript renews the hold under token ARGV[1] to ARGV[2] ms from
// now. Returns 1, or 0 when the hold is gone or already ran out.
var extendDeadScript = goredis.NewScript(luaNow + `
local now = now_ms()
local s = redis.call('ZSCORE', KEYS[8], ARGV[1])
if not s or tonumber(s) < now then return 0 end
redis.call('ZADD', KEYS[8], 'XX', ms(now + tonumber(ARGV[2])), ARGV[1])
return 1
`)

// deleteDeadScript scans one window of the dead list, at most ARGV[2]
// records, counted from the tail: it skips the ARGV[1] records nearest the
// tail that earlier windows of the same DeleteDead call kept, and removes
// every record in the window whose job ID is among ARGV[5...]. The work of
// one call is bounded by the window (one LRANGE, an LSET per match and one
// LREM), never by the list, so no call holds Redis for long.
//
// A window counts from the tail because only the head moves under the
// other dead-letter scripts (NextDead pops it, a hold returns to it) and
// appends at the tail only make a window see a kept record again. Removals
// by other DeleteDead and PurgeDead calls shift the records still to scan
// towards the tail, so every removal adds to deadrm: ARGV[3] is the count
// this call saw last ("" on its first window) and the window steps back by
// whatever others removed since, seeing some records twice rather than
// skipping one. Matches are overwritten with the tombstone ARGV[4], unique
// to the call, then removed together.
//
// Returns {removed, records kept from the tail so far, deadrm, done (1 when
// the window reached the head)}.
var deleteDeadScript = goredis.NewScript(`
local skip = tonumber(ARGV[1])
local seen = tonumber(redis.call('GET', KEYS[10]) or '0')
if ARGV[3] ~= '' then
  local others = seen - tonumber(ARGV[3])
  if others < 0 then skip = 0 else skip = math.max(skip - others, 0) end
end
local len = redis.call('LLEN', KEYS[7])
if skip >= len then return {0, skip, seen, 1} end
local w = tonumber(ARGV[2])
local first = math.max(len - skip - w, 0)
local recs = redis.call('LRANGE', KEYS[7], first, len - skip - 1)
local want = {}
for i = 5, #ARGV do want[ARGV[i]] = true end
local removed = 0
for i, rec in ipairs(recs) do
  local c = string.find(rec, ':', 1, true)
  if c then
    local n = tonumber(string.sub(rec, 1, c - 1))
    if n and want[string.sub(rec, c + 1, c + n)] then
      redis.call('LSET', KEYS[7], first + i - 1, ARGV[4])
      removed = removed + 1
    end
  end
end
if removed > 0 then
  redis.call('LREM', KEYS[7], -removed, ARGV[4])
  seen = redis.call('INCRBY', KEYS[10], removed)
end
local done = 0
if first == 0 then done = 1 end
return {removed, skip + #recs - removed, seen, done}
`)

// purgeDeadScript removes every dead record, held ones included, and returns
// how many it removed. UNLINK frees the records' memory off the server's
// main thread, so a purge costs the same at any depth.
var purgeDeadScript = goredis.NewScript(`
local n = redis.call('LLEN', KEYS[7]) + redis.call('ZCARD', KEYS[8])
redis.call('UNLINK', KEYS[7], KEYS[8], KEYS[9])
if n > 0 then redis.call('INCRBY', KEYS[10], n) end
return n
`)

// statsScript returns {ready, scheduled, inflight, dead, oldest}, counting
// expired leases and due scheduled jobs as ready. oldest is the ms at which
// the oldest of these became ready: the first in line of the ready list
// (its lease deadline when it came back from a lease, else its "r:" time),
// a due scheduled job's due time, or an expired lease's deadline; 0 when
// none is ready or the first in line has no "r:" time.
var statsScript = goredis.NewScript(luaNow + `
local now = now_ms()
local dueS = redis.call('ZCOUNT', KEYS[2], '-inf', ms(now))
local lostF = redis.call('ZCOUNT', KEYS[3], '-inf', ms(now - 1))
local oldest, known = nil, true
local function older(t)
  if t and (not oldest or t < oldest) then oldest = t end
end
local first = redis.call('LINDEX', KEYS[1], -1)
if first then
  local v = redis.call('HMGET', KEYS[4], 'm:' .. first, 'r:' .. first)
  if v[1] then
    older(tonumber(string.match(v[1], '^%d+:(%d+):')))
  elseif v[2] then
    older(tonumber(v[2]))
  else
    known = false
  end
end
if dueS > 0 then
  older(tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]))
end
if lostF > 0 then
  older(tonumber(redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')[2]))
end
if not known then oldest = nil end
return {
  redis.call('LLEN', KEYS[1]) + dueS + lostF,
  redis.call('ZCARD', KEYS[2]) - dueS,
  redis.call('ZCARD', KEYS[3]) - lostF,
  redis.call('LLEN', KEYS[7]) + redis.call('ZCARD', KEYS[8]),
  oldest or 0,
}
`)
