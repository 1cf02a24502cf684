package history

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// reads counts the bytes of the values a store returns.
type reads struct {
	driver.Store
	n atomic.Int64
}

func (r *reads) Get(ctx context.Context, key string) ([]byte, string, error) {
	v, rev, err := r.Store.Get(ctx, key)
	r.n.Add(int64(len(v)))
	return v, rev, err
}

// A read of a day of full buckets reads the newest first and stops at
// MaxReadBytes (plus one bucket at most), and says it was cut; the
// minutes it returns are the newest, oldest first.
func TestReadBytesBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	st := kv.Of(d, kv.History)
	var b bucket
	for i := range MaxSeries {
		b.Series = append(b.Series, Series{Queue: fmt.Sprintf("q%03d", i), Type: strings.Repeat("t", 200), Succeeded: 1})
	}
	v, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	const n = 120
	first := t0.Unix()/60 - n + 1
	var items []driver.BatchItem
	for i := range n {
		items = append(items, driver.BatchItem{Key: key(first + int64(i)), Value: v, TTL: time.Hour})
	}
	if _, err := st.CreateEach(ctx, items); err != nil {
		t.Fatal(err)
	}
	const budget = 1 << 20
	counted := &reads{Store: d}
	now := t0
	c := New(Config{Store: kv.Of(counted, kv.History), Now: func() time.Time { return now }, MaxReadBytes: budget})
	r, err := c.Read(ctx, t0.Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if got, most := counted.n.Load(), int64(budget+driver.MaxValueLen); got > most {
		t.Errorf("read %d bytes of buckets, want at most %d (MaxReadBytes %d plus a bucket)", got, most, budget)
	}
	want := (budget + len(v) - 1) / len(v)
	if !r.Cut || len(r.Minutes) != want {
		t.Fatalf("read %d minutes, cut %v; want %d (%d bytes each), cut", len(r.Minutes), r.Cut, want, len(v))
	}
	for i, m := range r.Minutes {
		if wantStart := time.Unix((first+int64(n-want+i))*60, 0).UTC(); !m.Start.Equal(wantStart) {
			t.Fatalf("minute %d starts %v, want %v (the newest, oldest first)", i, m.Start, wantStart)
		}
	}
	all := New(Config{Store: st, Now: func() time.Time { return now }, MaxReadBytes: n * len(v)})
	if r, err := all.Read(ctx, t0.Add(-24*time.Hour)); err != nil || r.Cut || len(r.Minutes) != n {
		t.Errorf("with room for every bucket: %d minutes, cut %v, %v; want %d, not cut", len(r.Minutes), r.Cut, err, n)
	}
}

// BenchmarkReadDay reads a day of full buckets (Buckets of MaxSeries
// series, about 45 KiB each) with the default MaxReadBytes and with none;
// bytes_read/op is what the store returned.
func BenchmarkReadDay(b *testing.B) {
	md, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer md.Close()
	d, err := driver.StoreOf(md)
	if err != nil {
		b.Fatal(err)
	}
	var bk bucket
	for i := range MaxSeries {
		bk.Series = append(bk.Series, Series{Queue: fmt.Sprintf("q%03d", i), Type: strings.Repeat("t", 200), Succeeded: 1})
	}
	v, _ := json.Marshal(bk)
	first := t0.Unix()/60 - int64(Buckets) + 1
	for i := 0; i < Buckets; i += driver.MaxBatch {
		var items []driver.BatchItem
		for j := i; j < min(i+driver.MaxBatch, Buckets); j++ {
			items = append(items, driver.BatchItem{Key: key(first + int64(j)), Value: v, TTL: time.Hour})
		}
		if _, err := kv.Of(d, kv.History).CreateEach(context.Background(), items); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct {
		name string
		max  int
	}{{"Default", 0}, {"Unbounded", 1 << 40}} {
		b.Run(bc.name, func(b *testing.B) {
			counted := &reads{Store: d}
			now := t0
			c := New(Config{Store: kv.Of(counted, kv.History), Now: func() time.Time { return now }, MaxReadBytes: bc.max})
			for b.Loop() {
				if _, err := c.Read(context.Background(), t0.Add(-24*time.Hour)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(counted.n.Load())/float64(b.N), "bytes_read/op")
		})
	}
}
