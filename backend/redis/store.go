package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The store (driver.Store): four keys under the hash tag {<Prefix>}, so one
// script reaches them all on a cluster too, and a queue's keys
// ({<Prefix>:<queue>}) never meet them.
//
//	{P}:store:data  hash: "m:"..key → "<revision>:<expiry µs>", "v:"..key → value
//	{P}:store:idx   zset, every key at score 0: the byte order of List
//	{P}:store:exp   zset of the keys with a TTL, by expiry
//	{P}:store:rev   the last revision given (INCR): never given twice
//
// Every operation is one script, on the server's clock (TIME, in
// microseconds): a key with expiry e is present while now < e. Expired keys
// are absent at once, and their space is reclaimed by the writes and Lists
// that come after: a script that writes n keys reclaims up to n+16, so the
// expired keys never outgrow the writes; a List reclaims up to 16.

var _ driver.Store = (*Backend)(nil)

const luaKV = `
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(x)
  return string.format('%d', x)
end
-- live parses a key's meta, "rev:exp": its revision and expiry (0: none)
-- when the key is live at now, else nil.
local function live(m, now)
  if not m then return nil end
  local r, e = string.match(m, '^(%d+):(%d+)$')
  e = tonumber(e)
  if e ~= 0 and now >= e then return nil end
  return r, e
end
-- meta returns the revision and expiry of a live key, else nil.
local function meta(k, now)
  return live(redis.call('HGET', KEYS[1], 'm:' .. k), now)
end
-- entry returns the revision and value of a live key, else nil: one call.
local function entry(k, now)
  local x = redis.call('HMGET', KEYS[1], 'm:' .. k, 'v:' .. k)
  local r = live(x[1], now)
  if not r then return nil end
  return r, x[2]
end
local function drop(k)
  redis.call('HDEL', KEYS[1], 'm:' .. k, 'v:' .. k)
  redis.call('ZREM', KEYS[2], k)
  redis.call('ZREM', KEYS[3], k)
end
local function sweep(now, n)
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', fmt(now), 'LIMIT', 0, n)) do
    drop(k)
  end
end
-- revs reserves n revisions, never given twice, and returns the first.
local function revs(n)
  return redis.call('INCRBY', KEYS[4], n) - n + 1
end
-- put writes key k at revision rev (a number from revs) and returns it.
-- olde is the expiry meta gave for a live k, which is in the index
-- already; nil for an absent k.
local function put(k, v, ttl_ms, now, rev, olde)
  rev = fmt(rev)
  local e = 0
  if ttl_ms > 0 then e = now + ttl_ms * 1000 end
  redis.call('HSET', KEYS[1], 'm:' .. k, rev .. ':' .. fmt(e), 'v:' .. k, v)
  if olde == nil then redis.call('ZADD', KEYS[2], 0, k) end
  if e > 0 then
    redis.call('ZADD', KEYS[3], fmt(e), k)
  elseif olde ~= 0 then
    redis.call('ZREM', KEYS[3], k)
  end
  return rev
end
`

var (
	// ARGV: key. Returns {revision, value}, or nil when absent.
	storeGetScript = goredis.NewScript(luaKV + `
local r, v = entry(ARGV[1], now_us())
if not r then return false end
return {r, v}
`)
	// ARGV: key, value, TTL ms. Returns the revision, or nil when present.
	storeCreateScript = goredis.NewScript(luaKV + `
local now = now_us()
if meta(ARGV[1], now) then return false end
sweep(now, 17)
return put(ARGV[1], ARGV[2], tonumber(ARGV[3]), now, revs(1), nil)
`)
	// ARGV: key, value, revision, TTL ms. Returns the new revision, or nil
	// when the key is not at that revision.
	storeUpdateScript = goredis.NewScript(luaKV + `
local now = now_us()
local r, e = meta(ARGV[1], now)
if r ~= ARGV[3] then return false end
sweep(now, 17)
return put(ARGV[1], ARGV[2], tonumber(ARGV[4]), now, revs(1), e)
`)
	// ARGV: key, revision or "". Returns 0 when the key is not at that
	// revision, else 1.
	storeDeleteScript = goredis.NewScript(luaKV + `
if ARGV[2] ~= '' and meta(ARGV[1], now_us()) ~= ARGV[2] then return 0 end
drop(ARGV[1])
return 1
`)
	// ARGV: lower bound, upper bound (ZRANGEBYLEX syntax), limit. Returns
	// the live keys in the range, up to limit.
	storeListScript = goredis.NewScript(luaKV + `
local now = now_us()
sweep(now, 16)
local lo, limit, out = ARGV[1], tonumber(ARGV[3]), {}
while #out < limit do
  local want = limit - #out
  local ks = redis.call('ZRANGEBYLEX', KEYS[2], lo, ARGV[2], 'LIMIT', 0, want)
  for _, k in ipairs(ks) do
    if meta(k, now) then out[#out + 1] = k end
  end
  if #ks < want then break end
  lo = '(' .. ks[#ks]
end
return out
`)
)

// storeKeys returns the store's keys, in the scripts' order.
func (b *Backend) storeKeys() []string {
	tag := "{" + b.cfg.Prefix + "}:store:"
	return []string{tag + "data", tag + "idx", tag + "exp", tag + "rev"}
}

// Get implements driver.Store.
func (b *Backend) Get(ctx context.Context, key string) ([]byte, string, error) {
	if b.closed.Load() {
		return nil, "", driver.ErrClosed
	}
	v, err := storeGetScript.Run(ctx, b.rdb, b.storeKeys(), key).Slice()
	if errors.Is(err, goredis.Nil) {
		return nil, "", driver.ErrKeyNotFound
	}
	if err != nil {
		return nil, "", fmt.Errorf("redis: store get: %w", err)
	}
	if len(v) != 2 {
		return nil, "", fmt.Errorf("redis: store get: unexpected reply of %d items", len(v))
	}
	rev, _ := v[0].(string)
	val, _ := v[1].(string)
	return []byte(val), rev, nil
}

// Create implements driver.Store.
func (b *Backend) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	if b.closed.Load() {
		return "", driver.ErrClosed
	}
	rev, err := storeCreateScript.Run(ctx, b.rdb, b.storeKeys(), key, value, ttl.Milliseconds()).Text()
	if errors.Is(err, goredis.Nil) {
		return "", driver.ErrKeyExists
	}
	if err != nil {
		return "", fmt.Errorf("redis: store create: %w", err)
	}
	return rev, nil
}

// Update implements driver.Store.
func (b *Backend) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	if b.closed.Load() {
		return "", driver.ErrClosed
	}
	nrev, err := storeUpdateScript.Run(ctx, b.rdb, b.storeKeys(), key, value, rev, ttl.Milliseconds()).Text()
	if errors.Is(err, goredis.Nil) {
		return "", driver.ErrRevision
	}
	if err != nil {
		return "", fmt.Errorf("redis: store update: %w", err)
	}
	return nrev, nil
}

// Delete implements driver.Store.
func (b *Backend) Delete(ctx context.Context, key, rev string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	n, err := storeDeleteScript.Run(ctx, b.rdb, b.storeKeys(), key, rev).Int()
	if err != nil {
		return fmt.Errorf("redis: store delete: %w", err)
	}
	if n == 0 {
		return driver.ErrRevision
	}
	return nil
}

// List implements driver.Store.
func (b *Backend) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	lo := "[" + prefix
	if after != "" && after >= prefix {
		lo = "(" + after
	}
	hi := "+"
	if prefix != "" {
		hi = "[" + prefix + "\xff" // keys are ASCII: every key with the prefix sorts below
	}
	keys, err := storeListScript.Run(ctx, b.rdb, b.storeKeys(), lo, hi, limit).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("redis: store list: %w", err)
	}
	return keys, nil
}

var _ driver.StoreBatcher = (*Backend)(nil)

var (
	// ARGV: key, value, TTL ms, for each item. Returns a revision per
	// item, nil for an item whose key is present.
	storeCreateEachScript = goredis.NewScript(luaKV + `
local now, out = now_us(), {}
sweep(now, #ARGV / 3 + 16)
local rev = revs(#ARGV / 3)
for i = 1, #ARGV, 3 do
  if meta(ARGV[i], now) then
    out[#out + 1] = false
  else
    out[#out + 1] = put(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), now, rev, nil)
    rev = rev + 1
  end
end
return out
`)
	// ARGV: the keys. Returns {revision, value} per key, nil for an absent
	// one.
	storeGetEachScript = goredis.NewScript(luaKV + `
local now, out = now_us(), {}
for i = 1, #ARGV do
  local r, v = entry(ARGV[i], now)
  if r then
    out[i] = {r, v}
  else
    out[i] = false
  end
end
return out
`)
	// ARGV: key, value, revision, TTL ms, for each item. Returns the new
	// revision per item, nil for an item whose key is not at its revision.
	storeUpdateEachScript = goredis.NewScript(luaKV + `
local now, out = now_us(), {}
sweep(now, #ARGV / 4 + 16)
local rev = revs(#ARGV / 4)
for i = 1, #ARGV, 4 do
  local r, e = meta(ARGV[i], now)
  if r ~= ARGV[i + 2] then
    out[#out + 1] = false
  else
    out[#out + 1] = put(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 3]), now, rev, e)
    rev = rev + 1
  end
end
return out
`)
	// ARGV: key, revision or "", for each item. Returns per item 0 when
	// the key is not at that revision, else 1.
	storeDeleteEachScript = goredis.NewScript(luaKV + `
local now, out = now_us(), {}
for i = 1, #ARGV, 2 do
  if ARGV[i + 1] ~= '' and meta(ARGV[i], now) ~= ARGV[i + 1] then
    out[#out + 1] = 0
  else
    drop(ARGV[i])
    out[#out + 1] = 1
  end
end
return out
`)
	// ARGV: limit, then lower and upper bound (ZRANGEBYLEX syntax) for
	// each prefix. Returns the live keys of each range, up to limit each.
	storeListEachScript = goredis.NewScript(luaKV + `
local now, limit, all = now_us(), tonumber(ARGV[1]), {}
sweep(now, 16)
for p = 2, #ARGV, 2 do
  local lo, out = ARGV[p], {}
  while #out < limit do
    local want = limit - #out
    local ks = redis.call('ZRANGEBYLEX', KEYS[2], lo, ARGV[p + 1], 'LIMIT', 0, want)
    for _, k in ipairs(ks) do
      if meta(k, now) then out[#out + 1] = k end
    end
    if #ks < want then break end
    lo = '(' .. ks[#ks]
  end
  all[#all + 1] = out
end
return all
`)
)

// runEach runs a batch script over args and checks that it answered one
// reply for each of the n items.
func (b *Backend) runEach(ctx context.Context, script *goredis.Script, op string, args []any, n int) ([]any, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	v, err := script.Run(ctx, b.rdb, b.storeKeys(), args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("redis: store %s: %w", op, err)
	}
	if len(v) != n {
		return nil, fmt.Errorf("redis: store %s: %d replies for %d items", op, len(v), n)
	}
	return v, nil
}

// GetEach implements driver.StoreBatcher: one script.
func (b *Backend) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	v, err := b.runEach(ctx, storeGetEachScript, "get", args, len(keys))
	if err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(keys))
	for i, x := range v {
		pair, _ := x.([]any)
		if len(pair) != 2 {
			out[i].Err = driver.ErrKeyNotFound
			continue
		}
		rev, _ := pair[0].(string)
		val, _ := pair[1].(string)
		out[i] = driver.BatchResult{Value: []byte(val), Rev: rev}
	}
	return out, nil
}

// CreateEach implements driver.StoreBatcher: one script.
func (b *Backend) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	args := make([]any, 0, 3*len(items))
	for _, it := range items {
		args = append(args, it.Key, it.Value, it.TTL.Milliseconds())
	}
	v, err := b.runEach(ctx, storeCreateEachScript, "create", args, len(items))
	if err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(items))
	for i, x := range v {
		if rev, ok := x.(string); ok {
			out[i].Rev = rev
		} else {
			out[i].Err = driver.ErrKeyExists
		}
	}
	return out, nil
}

var _ driver.StoreBatchUpdater = (*Backend)(nil)

// UpdateEach implements driver.StoreBatchUpdater: one script.
func (b *Backend) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	args := make([]any, 0, 4*len(items))
	for _, it := range items {
		args = append(args, it.Key, it.Value, it.Rev, it.TTL.Milliseconds())
	}
	v, err := b.runEach(ctx, storeUpdateEachScript, "update", args, len(items))
	if err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(items))
	for i, x := range v {
		if rev, ok := x.(string); ok {
			out[i].Rev = rev
		} else {
			out[i].Err = driver.ErrRevision
		}
	}
	return out, nil
}

// DeleteEach implements driver.StoreBatcher: one script.
func (b *Backend) DeleteEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	args := make([]any, 0, 2*len(items))
	for _, it := range items {
		args = append(args, it.Key, it.Rev)
	}
	v, err := b.runEach(ctx, storeDeleteEachScript, "delete", args, len(items))
	if err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(items))
	for i, x := range v {
		if n, _ := x.(int64); n == 0 {
			out[i].Err = driver.ErrRevision
		}
	}
	return out, nil
}

var _ driver.StoreBatchValueDeleter = (*Backend)(nil)

// ARGV: key, revision ("": any), value, for each item. Returns per item 1
// when the key was at that revision with that value and is deleted, else
// 0.
var storeDeleteValueEachScript = goredis.NewScript(luaKV + `
local now, out = now_us(), {}
for i = 1, #ARGV, 3 do
  local r, v = entry(ARGV[i], now)
  if not r or (ARGV[i + 1] ~= '' and r ~= ARGV[i + 1]) or v ~= ARGV[i + 2] then
    out[#out + 1] = 0
  else
    drop(ARGV[i])
    out[#out + 1] = 1
  end
end
return out
`)

// DeleteValueEach implements driver.StoreBatchValueDeleter: one script.
func (b *Backend) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	args := make([]any, 0, 3*len(items))
	for _, it := range items {
		args = append(args, it.Key, it.Rev, it.Value)
	}
	v, err := b.runEach(ctx, storeDeleteValueEachScript, "delete", args, len(items))
	if err != nil {
		return nil, err
	}
	out := make([]driver.BatchResult, len(items))
	for i, x := range v {
		if n, _ := x.(int64); n != 1 {
			out[i].Err = driver.ErrRevision
		}
	}
	return out, nil
}

// ListEach implements driver.StoreBatcher: one script.
func (b *Backend) ListEach(ctx context.Context, prefixes []string, limit int) ([][]string, error) {
	args := make([]any, 0, 1+2*len(prefixes))
	args = append(args, limit)
	for _, p := range prefixes {
		hi := "+"
		if p != "" {
			hi = "[" + p + "\xff" // keys are ASCII: every key with the prefix sorts below
		}
		args = append(args, "["+p, hi)
	}
	v, err := b.runEach(ctx, storeListEachScript, "list", args, len(prefixes))
	if err != nil {
		return nil, err
	}
	out := make([][]string, len(prefixes))
	for i, x := range v {
		ks, _ := x.([]any)
		out[i] = make([]string, 0, len(ks))
		for _, k := range ks {
			s, _ := k.(string)
			out[i] = append(out[i], s)
		}
	}
	return out, nil
}

var _ driver.StoreValueDeleter = (*Backend)(nil)

// ARGV: key, revision ("": any), value. Returns 1 when the key was at that revision
// with that value and is deleted, else 0.
var storeDeleteValueScript = goredis.NewScript(luaKV + `
local r, v = entry(ARGV[1], now_us())
if not r or (ARGV[2] ~= '' and r ~= ARGV[2]) then return 0 end
if v ~= ARGV[3] then return 0 end
drop(ARGV[1])
return 1
`)

// DeleteValue implements driver.StoreValueDeleter: one script.
func (b *Backend) DeleteValue(ctx context.Context, key, rev string, value []byte) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	n, err := storeDeleteValueScript.Run(ctx, b.rdb, b.storeKeys(), key, rev, value).Int()
	if err != nil {
		return fmt.Errorf("redis: store delete: %w", err)
	}
	if n == 0 {
		return driver.ErrRevision
	}
	return nil
}
