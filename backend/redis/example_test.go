package redis_test

import (
	"context"
	"log"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/redis"
)

// Example builds a Redis backend over a go-redis client and hands it to
// asyncplatform.New. The backend never closes the client.
func Example() {
	ctx := context.Background()
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	backend, err := redis.New(ctx, redis.Config{Client: rdb, Prefix: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()

	p, err := ap.New(backend, ap.Config{})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("email.send", func(ctx context.Context, job *ap.Job) error {
		log.Printf("sending %s", job.Payload)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	if err := p.Enqueue(ctx, &ap.Job{Type: "email.send", Payload: []byte("welcome mail")}); err != nil {
		log.Fatal(err)
	}
}
