package main

// The unique-key rows: what a UniqueKey costs one Enqueue on
// each backend. A unique job takes its key with one store Create before it
// is written; the rows time single Enqueues, one at a time, with and
// without a key, in alternating rounds (so that a drift of the machine's
// load falls on both alike), on our facade in a process of its own.
// RabbitMQ keeps no state: its keys are in the PostgreSQL companion
// (pgstore), as rabbit.Config.Store takes it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/rabbit"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/pgstore"
)

// uniqueSystem names the unique-key child in a childSpec.
const uniqueSystem = "unique"

// uniqueRounds is how many alternating rounds of each kind a child runs.
const uniqueRounds = 5

// uniqueResult is what one unique-key child reports.
type uniqueResult struct {
	Backend    string
	PerRound   int
	Plain, Key uniqueFigures
	Load       float64
	Err        string
}

// uniqueFigures are the latencies of one kind of Enqueue.
type uniqueFigures struct {
	N         int
	Mean      time.Duration
	P50, P99  time.Duration
	PerSecond float64 // one caller, one at a time
}

func figures(d []time.Duration) uniqueFigures {
	if len(d) == 0 {
		return uniqueFigures{}
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	slices.Sort(d)
	mean := sum / time.Duration(len(d))
	return uniqueFigures{N: len(d), Mean: mean, P50: percentile(d, 50), P99: percentile(d, 99), PerSecond: float64(time.Second) / float64(mean)}
}

// measureUniques measures every backend o names, one after another.
func measureUniques(o options) []uniqueResult {
	var out []uniqueResult
	for _, b := range storeBackends(o) {
		r := measureUnique(b, o)
		log.Printf("%s unique keys: %s", b, r.summary())
		out = append(out, r)
	}
	return out
}

// measureUnique runs one backend's unique-key child.
func measureUnique(backend string, o options) uniqueResult {
	r := uniqueResult{Backend: backend}
	n := o.N / 10
	if backend == "azure" {
		n = o.AzureN / 10
	}
	spec := childSpec{Backend: backend, System: uniqueSystem, Srv: o.Srv, Plan: plan{N: max(n, 50)}}
	if err := runJSONChild(spec, 10*time.Minute, &r); err != nil {
		r.Err = err.Error()
	}
	return r
}

// runUniqueChild measures one backend and prints its result as JSON:
// spec.Plan.N Enqueues of each kind per round.
func runUniqueChild(spec childSpec) {
	r := uniqueResult{Backend: spec.Backend, PerRound: spec.Plan.N, Load: loadAvg()}
	err := uniqueLoop(context.Background(), spec, &r)
	if err != nil {
		r.Err = err.Error()
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

func uniqueLoop(ctx context.Context, spec childSpec, r *uniqueResult) (err error) {
	tag := fmt.Sprintf("unique-%d", os.Getpid())
	be, cleanup, err := openUniqueBackend(ctx, spec.Backend, tag, spec.Srv)
	if err != nil {
		return err
	}
	queue := "bench-" + tag
	defer func() {
		if d, ok := be.(driver.QueueDeleter); ok {
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			err = errors.Join(err, d.DeleteQueue(dctx, queue))
			cancel()
		}
		err = errors.Join(err, be.Close(), cleanup())
	}()
	p, err := ap.New(be, ap.Config{Logger: quiet})
	if err != nil {
		return err
	}
	payload := make([]byte, 100)
	i := 0
	enqueue := func(key bool) (time.Duration, error) {
		j := &ap.Job{Type: "bench", Queue: queue, Payload: payload}
		if key {
			// A window of a minute: the keys outlive the run briefly, and
			// nothing takes the jobs.
			j.UniqueKey, j.UniqueWindow = fmt.Sprintf("%s/%d", tag, i), time.Minute
		}
		i++
		start := time.Now()
		err := p.Enqueue(ctx, j)
		return time.Since(start), err
	}
	for range 20 { // warm up: connections, the queue's declaration
		if _, err := enqueue(true); err != nil {
			return err
		}
	}
	var plain, keyed []time.Duration
	for range uniqueRounds {
		for _, key := range []bool{false, true} {
			for range spec.Plan.N {
				d, err := enqueue(key)
				if err != nil {
					return err
				}
				if key {
					keyed = append(keyed, d)
				} else {
					plain = append(plain, d)
				}
			}
		}
	}
	r.Plain, r.Key = figures(plain), figures(keyed)
	return nil
}

// openUniqueBackend is openBackend, with RabbitMQ's companion store.
func openUniqueBackend(ctx context.Context, backend, tag string, srv servers) (driver.Backend, func() error, error) {
	if backend != "rabbit" {
		be, cleanup, err := openBackend(ctx, backend, tag, true, srv)
		return be, func() error { cleanup(); return nil }, err
	}
	table := "bench_unique_" + strings.ReplaceAll(tag, "-", "_")
	st, err := pgstore.New(ctx, pgstore.Config{URL: srv.Postgres, Table: table, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	be, err := rabbit.New(ctx, rabbit.Config{URL: srv.AMQP, Prefix: "bench", Logger: quiet, Store: st})
	if err != nil {
		st.Close()
		return nil, nil, errors.Join(err, dropTable(srv.Postgres, table))
	}
	return be, func() error { st.Close(); return dropTable(srv.Postgres, table) }, nil
}

func (r uniqueResult) summary() string {
	s := fmt.Sprintf("without a key p50 %v mean %v, with a key p50 %v mean %v (+%v)",
		r.Plain.P50.Round(time.Microsecond), r.Plain.Mean.Round(time.Microsecond),
		r.Key.P50.Round(time.Microsecond), r.Key.Mean.Round(time.Microsecond), (r.Key.Mean - r.Plain.Mean).Round(time.Microsecond))
	if r.Err != "" {
		s += " ERROR " + r.Err
	}
	return s
}

// writeUnique writes the unique-key table.
func (rep *report) writeUnique(w func(string, ...any)) {
	if len(rep.Unique) == 0 {
		return
	}
	w("## Unique keys: the cost per enqueue\n\n")
	w("Single `Enqueue`s of a 100-byte job, one at a time from one goroutine, through our facade in a process of its own: %d rounds, each %s without a `UniqueKey` and then as many with one (a new key each, `UniqueWindow` 1 min); the keys are in the backend's store (RabbitMQ: the PostgreSQL companion, `pgstore`). A key costs one store `Create` before the write. **+mean** is the mean with a key less the mean without.\n\n",
		uniqueRounds, "N/10 (Azure: azure-n/10, at least 50)")
	w("| backend | per round | without: p50 | mean | p99 | with a key: p50 | mean | p99 | +mean | load | |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range rep.Unique {
		w("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %.1f | %s |\n", r.Backend, r.PerRound,
			durCell(r.Plain.P50), durCell(r.Plain.Mean), durCell(r.Plain.P99),
			durCell(r.Key.P50), durCell(r.Key.Mean), durCell(r.Key.P99), durCell(r.Key.Mean-r.Plain.Mean), r.Load, r.Err)
	}
	w("\n")
}
