package nats

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestStaleRequestFact records, with nats.go alone (no platform code), what
// a pull request left behind by a vanished client does to a work-queue
// consumer when a lease runs out. Messages r and then s are delivered (s is
// the newest the consumer handed out); s's holder stays alive (InProgress
// every AckWait/4), r's does not (a crash). A second connection sends a long
// pull request and closes (a killed worker: its request stays in the
// consumer's waiting list, with no one listening). When r's AckWait runs
// out, a live client asks for messages.
//
// On nats-server 2.9.10 (and, by the source, up to 2.10.13): the live client gets s, with
// NumDelivered 1, while s's first holder still holds it, and r does not
// come until one more AckWait, with NumDelivered 3. In loopAndGatherMsgs,
// the server took r from its redelivery queue (counting a delivery), found
// no request with interest, and "redid" it with o.sseq--, which is right
// for a new message only: the consumer's next sequence went back onto s.
// Fixed in 2.10.14 (nats-server PR #5305, "Multiple deliveries of messages
// with delivery count going backwards"); 2.15.2 (in process) delivers r,
// NumDelivered 2, and s not at all. The live client acks r as it comes and
// takes what comes within two AckWaits.
//
// The test only records; it fails only when nothing comes.
func TestStaleRequestFact(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"server":    func(t *testing.T) string { return realURL(t) },
		"inprocess": func(t *testing.T) string { return startServer(t, t.TempDir(), 0).ClientURL() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			u := url(t)
			version, got := staleRequestFact(t, u, "STALEFACT_"+name)
			var b strings.Builder
			for _, g := range got {
				fmt.Fprintf(&b, " %s", g)
			}
			t.Logf("%s: after a vanished client's pull request and a lapsed lease, a live client got (message:NumDelivered):%s", version, b.String())
			if len(got) == 0 {
				t.Fatal("nothing came")
			}
		})
	}
}

// staleRequestFact runs the fact's steps and returns the server's version
// and what the live client got after r's lease ran out, as message:NumDelivered.
func staleRequestFact(t *testing.T, url, name string) (string, []string) {
	const ackWait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := gonats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	name = fmt.Sprintf("%s_%06d", name, rand.IntN(1e6))
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), name)
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: ackWait, MaxDeliver: -1, MaxAckPending: -1}); err != nil {
		t.Fatal(err)
	}
	next := "$JS.API.CONSUMER.MSG.NEXT." + name + ".c"
	for _, body := range []string{"r", "s"} {
		if _, err := js.Publish(ctx, name+".x", []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	// pull sends one pull request on conn and collects what it delivers
	// until the request ends or wait passes, acking r as it comes if ackR.
	pull := func(conn *gonats.Conn, req pullRequest, wait time.Duration, ackR bool) []*gonats.Msg {
		inbox := conn.NewInbox()
		sub, err := conn.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		data, _ := json.Marshal(req)
		if err := conn.PublishRequest(next, inbox, data); err != nil {
			t.Fatal(err)
		}
		var out []*gonats.Msg
		for end := time.Now().Add(wait); len(out) < req.Batch; {
			m, err := sub.NextMsg(time.Until(end))
			if err != nil {
				break
			}
			if len(m.Data) == 0 && m.Header.Get("Status") != "" {
				break
			}
			out = append(out, m)
			if ackR && string(m.Data) == "r" {
				if err := m.Respond(ackAck); err != nil {
					t.Fatal(err)
				}
			}
		}
		return out
	}
	held := pull(nc, pullRequest{Batch: 2, NoWait: true}, 2*time.Second, false)
	if len(held) != 2 || string(held[1].Data) != "s" {
		t.Fatalf("first pull got %d messages, want r and s", len(held))
	}
	// s's holder is alive: it keeps its lease.
	alive := make(chan struct{})
	defer close(alive)
	go func() {
		tick := time.NewTicker(ackWait / 4)
		defer tick.Stop()
		for {
			select {
			case <-alive:
				return
			case <-tick.C:
				_ = nc.Publish(held[1].Reply, ackProgress)
			}
		}
	}()
	// A worker that is killed while its long poll is out.
	nc2, err := gonats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	sub2, err := nc2.SubscribeSync(nc2.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(pullRequest{Batch: 1, Expires: time.Minute})
	if err := nc2.PublishRequest(next, sub2.Subject, data); err != nil {
		t.Fatal(err)
	}
	if err := nc2.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	nc2.Close()

	time.Sleep(ackWait + ackWait/2) // r's lease runs out; s's is kept
	var got []string
	for _, m := range pull(nc, pullRequest{Batch: 10, Expires: 2 * ackWait}, 3*ackWait, true) {
		md, err := parseAck(m.Reply)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s:%d", m.Data, md.delivered))
	}
	return nc.ConnectedServerVersion(), got
}
