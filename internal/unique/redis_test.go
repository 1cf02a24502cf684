package unique_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
	"github.com/asyncplatform/asyncplatform/internal/unique"
)

// redisStore returns a namespace of its own in the machine's Redis store,
// whose revisions are sequential: what a forger guesses.
func redisStore(t *testing.T) *kv.Store {
	t.Helper()
	addr := testenv.Getenv("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379")
	rc := goredis.NewClient(&goredis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rc.Ping(ctx).Err(); err != nil {
		rc.Close()
		testenv.Unreachable(t, "Redis at "+addr, err)
	}
	b, err := redis.New(context.Background(), redis.Config{Client: rc, Prefix: "apt-unique"})
	if err != nil {
		rc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(); rc.Close() })
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	return kv.Of(d, kv.Namespace("_u"+hex.EncodeToString(r[:])))
}

// On Redis, revisions are sequential: a forger who tries the revisions
// around a live claim's, without its token, releases nothing.
func TestReleaseNeedsTokenRedis(t *testing.T) {
	t.Parallel()
	st := redisStore(t)
	c := unique.New(unique.Config{Store: st})
	ctx := context.Background()
	real := take(t, c, "invoice-42", "victim", unique.OnFinish)
	rev, err := strconv.ParseInt(real.Rev, 10, 64)
	if err != nil {
		t.Skipf("revision %q is not a number on this Redis: nothing to guess", real.Rev)
	}
	for r := max(rev-100, 1); r <= rev+100; r++ {
		forged := unique.Claim{Key: "invoice-42", Rev: strconv.FormatInt(r, 10), Window: time.Hour}
		c.Release(ctx, "q", "forger", forged.Header(), true)
	}
	if h := holder(t, st, "invoice-42"); h != "victim" {
		t.Fatalf("201 forged headers around revision %d released the key (held by %q)", rev, h)
	}
	c.Release(ctx, "q", "victim", real.Header(), false)
	if h := holder(t, st, "invoice-42"); h != "" {
		t.Fatalf("the real header did not release the key (held by %q)", h)
	}
	_ = st.Delete(ctx, "invoice-42", "")
}
