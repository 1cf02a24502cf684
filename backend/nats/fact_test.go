package nats

import (
	"context"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestFilteredPurgeFact records why the backend never purges: it purges one
// subject of a stream while a consumer has a message of another subject
// pending and one not yet delivered, and logs what the consumer still gets.
// On nats-server 2.9.10 it gets nothing: both messages stay in the stream,
// undeliverable. The in-process 2.15 server delivers both.
func TestFilteredPurgeFact(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"server":    func(t *testing.T) string { return realURL(t) },
		"inprocess": func(t *testing.T) string { return startServer(t, t.TempDir(), 0).ClientURL() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			nc, err := gonats.Connect(url(t))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			stream := "PURGEFACT_" + token(queueName(t))[:6] + name
			s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage})
			if err != nil {
				t.Fatal(err)
			}
			defer js.DeleteStream(ctx, stream)
			c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxAckPending: -1})
			if err != nil {
				t.Fatal(err)
			}
			for _, subj := range []string{"x", "y", "x"} {
				if _, err := js.Publish(ctx, stream+"."+subj, []byte(subj)); err != nil {
					t.Fatal(err)
				}
			}
			get := func(ack bool) jetstream.Msg {
				b, _ := c.Fetch(1, jetstream.FetchMaxWait(1500*time.Millisecond))
				m, ok := <-b.Messages()
				if ok && ack {
					_ = m.Ack()
				}
				return m
			}
			_ = get(false).NakWithDelay(100 * time.Millisecond) // pending, as the mover's are
			if err := s.Purge(ctx, jetstream.WithPurgeSubject(stream+".y")); err != nil {
				t.Fatal(err)
			}
			got := 0
			for i := 0; i < 2; i++ {
				if get(true) != nil {
					got++
				}
			}
			info, _ := s.Info(ctx)
			t.Logf("%s: after purging another subject the consumer got %d of 2 messages; %d left in the stream", nc.ConnectedServerVersion(), got, info.State.Msgs)
		})
	}
}
