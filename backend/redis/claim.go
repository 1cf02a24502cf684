package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.ClaimingEnqueuer = (*Backend)(nil)

// enqueueClaimingScript stores copies, each only when its claim's store
// key is created, in one script. KEYS: the queue's first keySeq+1 keys,
// then the store's four (Backend.storeKeys). ARGV: quintuples of
// (not-before ms, body, claim key or "", claim value, claim TTL ms).
// Returns, for each copy, 1 when stored, or {value} of the key that
// refused it.
var enqueueClaimingScript = goredis.NewScript(luaNow + luaWake + luaStore +
	strings.NewReplacer("KEYS[1]", "KEYS[7]", "KEYS[2]", "KEYS[8]", "KEYS[3]", "KEYS[9]", "KEYS[4]", "KEYS[10]").Replace(luaKV) + `
local now = now_ms()
local now_u = now_us()
local out = {}
sweep(now_u, #ARGV / 5 + 16)
local rev = revs(#ARGV / 5)
for i = 1, #ARGV, 5 do
  local k = ARGV[i + 2]
  local r, v
  if k ~= '' then r, v = entry(k, now_u) end
  if r then
    out[#out + 1] = {v}
  else
    if k ~= '' then
      put(k, ARGV[i + 3], tonumber(ARGV[i + 4]), now_u, rev, nil)
      rev = rev + 1
    end
    store(now, tonumber(ARGV[i]), ARGV[i + 1])
    out[#out + 1] = 1
  end
end
wake()
return out
`)

// ClaimsWithEnqueue implements driver.ClaimingEnqueuer: on one server (a
// *goredis.Client, Sentinel's included) without WaitReplicas. A cluster
// keeps the store's keys and a queue's in different slots, which one
// script cannot reach together.
func (b *Backend) ClaimsWithEnqueue() bool {
	_, single := b.rdb.(*goredis.Client)
	return single && b.cfg.WaitReplicas == 0
}

// EnqueueClaiming implements driver.ClaimingEnqueuer: one script.
func (b *Backend) EnqueueClaiming(ctx context.Context, queue string, msgs []driver.ClaimMessage) ([]driver.ClaimResult, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if !b.ClaimsWithEnqueue() {
		return nil, fmt.Errorf("redis: enqueue to %q with claims: %w", queue, errNoClaims)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	args := make([]any, 0, 5*len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if c := m.Claim; c != nil {
			args = append(args, unixMs(m.NotBefore), m.Body, c.Key, c.Value, c.TTL.Milliseconds())
		} else {
			args = append(args, unixMs(m.NotBefore), m.Body, "", "", 0)
		}
	}
	keys := make([]string, 0, keySeq+5)
	keys = append(append(keys, b.keys(queue)[:keySeq+1]...), b.storeKeys()...)
	v, err := enqueueClaimingScript.Run(ctx, b.rdb, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("redis: enqueue to %q with claims: %w", queue, err)
	}
	if len(v) != len(msgs) {
		return nil, fmt.Errorf("redis: enqueue to %q with claims: %d replies for %d messages", queue, len(v), len(msgs))
	}
	out := make([]driver.ClaimResult, len(msgs))
	for i, x := range v {
		if held, ok := x.([]any); ok {
			val := ""
			if len(held) == 1 {
				val, _ = held[0].(string)
			}
			out[i] = driver.ClaimResult{Err: driver.ErrKeyExists, Value: []byte(val)}
		}
	}
	return out, nil
}

// errNoClaims is EnqueueClaiming's error on a backend that cannot claim
// with its enqueue (ClaimsWithEnqueue false).
var errNoClaims = fmt.Errorf("%w: the store's keys and the queue's are not on one server", errors.ErrUnsupported)
