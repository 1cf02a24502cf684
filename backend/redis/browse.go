package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.Browser = (*Backend)(nil)

// browseScript returns {total, then per item: id (cut to ARGV[5] bytes),
// body size, body (empty when over ARGV[4] bytes), at (ms, 0 unknown),
// deliveries} for up to
// ARGV[3] items of state ARGV[1] from position ARGV[2]. Ready is, in the
// order claims take them: the ready list from its out end, then expired
// leases, then due scheduled copies (as the claim script moves them);
// scheduled and in flight are the rest of their sorted sets. It reads
// only.
var browseScript = goredis.NewScript(luaNow + `
local now = now_ms()
local state, off, limit, maxb, maxid = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ids, ats = {}, {}
local function zadd(r)
  for j = 1, #r, 2 do ids[#ids + 1] = r[j]; ats[#ats + 1] = tonumber(r[j + 1]) end
end
local total
if state == 'ready' then
  local L = redis.call('LLEN', KEYS[1])
  local F = redis.call('ZCOUNT', KEYS[3], '-inf', ms(now - 1))
  local D = redis.call('ZCOUNT', KEYS[2], '-inf', ms(now))
  total = L + F + D
  local i = off
  while #ids < limit and i < total do
    local n
    if i < L then
      n = math.min(limit - #ids, L - i)
      local r = redis.call('LRANGE', KEYS[1], -(i + n), -(i + 1))
      for j = #r, 1, -1 do ids[#ids + 1] = r[j]; ats[#ats + 1] = false end
    elseif i < L + F then
      n = math.min(limit - #ids, L + F - i)
      zadd(redis.call('ZRANGE', KEYS[3], i - L, i - L + n - 1, 'WITHSCORES'))
    else
      n = math.min(limit - #ids, total - i)
      zadd(redis.call('ZRANGE', KEYS[2], i - L - F, i - L - F + n - 1, 'WITHSCORES'))
    end
    i = i + n
  end
else
  local key, first = KEYS[2], redis.call('ZCOUNT', KEYS[2], '-inf', ms(now))
  if state ~= 'scheduled' then
    key, first = KEYS[3], redis.call('ZCOUNT', KEYS[3], '-inf', ms(now - 1))
  end
  total = redis.call('ZCARD', key) - first
  if off < total then
    zadd(redis.call('ZRANGE', key, first + off, first + math.min(off + limit, total) - 1, 'WITHSCORES'))
  end
end
local out = {total}
for j, id in ipairs(ids) do
  local v = redis.call('HMGET', KEYS[4], 'm:' .. id, 'r:' .. id)
  local size = redis.call('HSTRLEN', KEYS[4], id)
  local body = ''
  if size <= maxb then body = redis.call('HGET', KEYS[4], id) or '' end
  local at = ats[j]
  if not at then
    at = (v[1] and tonumber(string.match(v[1], '^%d+:(%d+):'))) or tonumber(v[2]) or 0
  end
  local deliveries = (v[1] and tonumber(string.match(v[1], '^(%d+):'))) or 0
  out[#out + 1] = string.sub(id, 1, maxid)
  out[#out + 1] = size
  out[#out + 1] = body
  out[#out + 1] = at
  out[#out + 1] = deliveries
end
return out
`)

// Browse implements driver.Browser with one read-only script over the
// queue's keys; the cursor is a position in the state's order, so under
// traffic a walk may miss or repeat a copy that moved.
func (b *Backend) Browse(ctx context.Context, queue string, state driver.BrowseState, cursor string, limit int) (driver.BrowsePage, error) {
	if b.closed.Load() {
		return driver.BrowsePage{}, driver.ErrClosed
	}
	switch state {
	case driver.BrowseReady, driver.BrowseScheduled, driver.BrowseInFlight:
	default:
		return driver.BrowsePage{}, fmt.Errorf("redis: browse: unknown state %q", state)
	}
	off, err := driver.ParseOffsetCursor(state, cursor)
	if err != nil {
		return driver.BrowsePage{}, err
	}
	limit = driver.BrowseLimit(limit)
	v, err := browseScript.Run(ctx, b.rdb, b.keys(queue), string(state), off, limit, driver.MaxBrowseBody, driver.MaxBrowseID).Slice()
	if err != nil {
		return driver.BrowsePage{}, fmt.Errorf("redis: browse %s of %q: %w", state, queue, err)
	}
	if len(v) < 1 || (len(v)-1)%5 != 0 || (len(v)-1)/5 > limit {
		return driver.BrowsePage{}, fmt.Errorf("redis: browse %s of %q: unexpected reply of %d items", state, queue, len(v))
	}
	total, _ := v[0].(int64)
	page := driver.BrowsePage{Items: make([]driver.BrowseItem, 0, (len(v)-1)/5)}
	for i := 1; i < len(v); i += 5 {
		id, _ := v[i].(string)
		if len(id) > driver.MaxBrowseID {
			return driver.BrowsePage{}, fmt.Errorf("redis: browse %s of %q: an ID of %d bytes in the reply", state, queue, len(id))
		}
		size, _ := v[i+1].(int64)
		body, _ := v[i+2].(string)
		at, _ := v[i+3].(int64)
		n, _ := v[i+4].(int64)
		it := driver.BrowseItem{ID: id, BodySize: int(size), Deliveries: int(n)}
		if size <= driver.MaxBrowseBody {
			it.Body = []byte(body)
		}
		if at > 0 {
			it.At = time.UnixMilli(at)
		}
		page.Items = append(page.Items, it)
	}
	if end := off + int64(len(page.Items)); end < total && len(page.Items) > 0 {
		page.Next = driver.OffsetCursor(end)
	}
	return page, nil
}
