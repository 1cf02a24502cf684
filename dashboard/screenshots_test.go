package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/dashboard"
)

// TestScreenshots saves the screenshots of docs/ (dashboard-*.png) into
// the folder ASYNCPLATFORM_DASHBOARD_SCREENSHOTS names, from a platform on
// the memory backend with ten minutes of made-up history for the charts:
//
//	ASYNCPLATFORM_DASHBOARD_SCREENSHOTS=$PWD/docs go test -count=1 -run TestScreenshots ./dashboard
func TestScreenshots(t *testing.T) {
	if os.Getenv(screenshotsEnv) == "" {
		t.Skip("set " + screenshotsEnv + " to a folder to make the screenshots")
	}
	ctx := browser(t)
	b := memory.NewBroker().Connect()
	defer b.Close()
	rec := dashboard.NewRecorder()
	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{
			"emails": {Concurrency: 4}, "billing": {Concurrency: 4}, "webhooks": {Concurrency: 4}, "reports": {Concurrency: 4},
		},
		Policy:           ap.Policy{RetryLimit: ap.Limit(0)},
		UnhandledRetries: ap.Limit(0),
		WorkerName:       "worker-7f9c4:4211",
		TrackStatus:      true,
		WorkerHeartbeat:  200 * time.Millisecond,
		Schedules: []ap.Schedule{
			{Name: "reports.monthly", Cron: "0 0 6 1 * *", CatchUp: 1, Job: ap.Job{Type: "report.export", Queue: "reports"}},
			{Name: "digest.weekly", Cron: "0 0 8 * * MON", Job: ap.Job{Type: "email.digest", Queue: "emails"}},
			{Name: "cleanup", Every: time.Hour, Job: ap.Job{Type: "cleanup.tmp", Queue: "reports"}},
		},
		Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(p.Handle("email.send", func(ctx context.Context, j *ap.Job) error {
		return fmt.Errorf("smtp: 421 4.7.0 mx.example.net: too many connections from 203.0.113.9, try again later")
	}))
	must(p.Handle("email.digest", func(ctx context.Context, j *ap.Job) error {
		return ap.Permanent(errors.New("template digest-weekly: no such template"))
	}))
	must(p.Handle("invoice.render", func(ctx context.Context, j *ap.Job) error {
		return ap.Invalid(errors.New(`invoice 2024-0193: line 3: "amount" is negative`))
	}))
	must(p.Handle("webhook.deliver", func(ctx context.Context, j *ap.Job) error {
		panic(fmt.Sprintf("webhook: no signing secret for tenant %q", j.Headers["tenant"])) // kept with its stack
	}))
	must(p.Handle(hostileType, func(ctx context.Context, j *ap.Job) error { return ap.Permanent(errors.New(hostileError)) }))
	// A workflow for its page: two steps done, one running, one waiting.
	invoicing := make(chan struct{})
	step := func(ctx context.Context, j *ap.Job) error {
		j.SetResult(fmt.Appendf(nil, `{"step":%q,"ok":true}`, j.Type))
		return nil
	}
	must(p.Handle("order.pick", step))
	must(p.Handle("order.pack", step))
	must(p.Handle("invoice.issue", func(ctx context.Context, j *ap.Job) error {
		select {
		case <-invoicing:
		case <-ctx.Done():
		}
		return nil
	}))
	must(p.Handle("order.ship", step))
	must(p.Start(context.Background()))
	defer p.Stop(context.Background())
	defer close(invoicing) // before Stop: the running step returns

	var jobs []*ap.Job
	for i := range 37 {
		jobs = append(jobs, &ap.Job{Type: "email.send", Queue: "emails", Payload: fmt.Appendf(nil, `{"to":"customer%d@example.com","template":"receipt","order":%d,"locale":"en-GB"}`, i, 88120+i),
			Headers: map[string]string{"traceparent": fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e%04d-00f067aa0ba902b7-01", i), "tenant": "acme"}})
		if i%4 == 0 {
			jobs = append(jobs, &ap.Job{Type: "email.digest", Queue: "emails", Payload: fmt.Appendf(nil, `{"user":%d,"week":"2026-W47"}`, 1000+i)})
		}
	}
	for i := range 6 {
		jobs = append(jobs, &ap.Job{Type: "invoice.render", Queue: "billing", Payload: fmt.Appendf(nil, "%%PDF-1.7\n%%\xe2\xe3\xcf\xd3\n%d 0 obj", i)})
	}
	for i := range 3 {
		jobs = append(jobs, &ap.Job{Type: "webhook.deliver", Queue: "webhooks", Payload: fmt.Appendf(nil, `{"url":"https://hooks.example.com/orders","event":"order.paid","id":"evt_%d"}`, 5521+i),
			Headers: map[string]string{"content-type": "application/json", "tenant": "globex"}})
	}
	jobs = append(jobs, &ap.Job{Type: "report.export", Queue: "reports", Payload: []byte(`{"report":"monthly-revenue"}`)}, hostileJob())
	jobs[len(jobs)-1].Queue = "reports"
	must(p.EnqueueBatch(context.Background(), jobs))
	wf := ap.NewWorkflow("order-88120").
		Add("pick", &ap.Job{Type: "order.pick", Queue: "reports", Payload: []byte(`{"order":88120}`)}).
		Add("pack", &ap.Job{Type: "order.pack", Queue: "reports"}, "pick").
		Add("invoice", &ap.Job{Type: "invoice.issue", Queue: "billing"}, "pick").
		Add("ship", &ap.Job{Type: "order.ship", Queue: "reports"}, "pack", "invoice")
	must(p.EnqueueWorkflow(context.Background(), wf))
	// Waiting and scheduled work, for the depths.
	for i := range 140 {
		must(p.Enqueue(context.Background(), &ap.Job{Type: "sms.send", Queue: "notifications", NotBefore: time.Now().Add(time.Duration(i%20+1) * time.Hour)}))
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, _ := p.Stats(context.Background(), "emails")
		w, _ := p.Stats(context.Background(), "webhooks")
		if s.Dead == 47 && w.Dead == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	d, err := dashboard.New(p, dashboard.Config{Recorder: rec, Deleter: b, Title: "acme jobs", Logger: quiet()})
	must(err)
	// Ten minutes of history: attempts and depths.
	now := time.Now()
	for i := range dashboard.Buckets {
		at := now.Add(-time.Duration(dashboard.Buckets-1-i) * dashboard.BucketWidth)
		rec.SetClock(func() time.Time { return at })
		wave := func(base, amp, phase float64) int {
			return int(base + amp*math.Sin(float64(i)/6+phase))
		}
		for q, shape := range map[string][3]int{"emails": {wave(40, 18, 0), wave(3, 3, 1), 0}, "billing": {wave(12, 6, 2), i % 7 / 6, 0},
			"webhooks": {wave(25, 10, 4), wave(2, 2, 0), 0}, "notifications": {wave(60, 25, 1), 0, 0}} {
			for range shape[0] {
				rec.AfterAttempt(context.Background(), ap.Attempt{Job: &ap.Job{Queue: q}, Outcome: ap.OutcomeSucceeded})
			}
			for range max(shape[1], 0) {
				rec.AfterAttempt(context.Background(), ap.Attempt{Job: &ap.Job{Queue: q}, Outcome: ap.OutcomeRetried})
			}
		}
		d.Sample("emails", ap.QueueStats{Ready: int64(wave(120, 90, 0)), Scheduled: 14, InFlight: 8, Dead: int64(min(47, 20+i/2))}, at)
		d.Sample("notifications", ap.QueueStats{Ready: int64(wave(40, 30, 2)), Scheduled: 140, InFlight: 4}, at)
		d.Sample("webhooks", ap.QueueStats{Ready: int64(wave(30, 20, 3)), InFlight: 2, Dead: int64(min(3, i/20))}, at)
		d.Sample("billing", ap.QueueStats{Ready: int64(wave(10, 8, 1)), Dead: int64(min(6, i/10))}, at)
	}
	rec.SetClock(time.Now)
	srv := httptest.NewServer(d)
	defer srv.Close()

	do(t, ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
	shot(t, ctx, "queues")
	do(t, ctx, chromedp.Navigate(srv.URL+"/queue?q=emails&type=email.send&text=smtp&n=12"), chromedp.WaitVisible(chromedp.CSS("#letters")))
	shot(t, ctx, "queue")
	do(t, ctx, chromedp.Navigate(srv.URL+"/queue?q=webhooks"), chromedp.WaitVisible(chromedp.CSS("#letters")),
		chromedp.Click(chromedp.CSS(`#letters td.id a`)), chromedp.WaitVisible(chromedp.CSS("#letter-id")))
	if got := text(t, ctx, "#last-error"); !strings.Contains(got, "panic") {
		t.Errorf("the webhook's error %q has no panic", got)
	}
	shot(t, ctx, "letter")
	do(t, ctx, chromedp.Navigate(srv.URL+"/queue?q=emails&type=email.send&text=smtp"), chromedp.WaitVisible(chromedp.CSS("#letters")))
	submit(t, ctx, "#delete-matching button")
	shot(t, ctx, "confirm")
	do(t, ctx, chromedp.Navigate(srv.URL+"/queue?q=reports&type=%3Cscript*"), chromedp.WaitVisible(chromedp.CSS("#letters")),
		chromedp.Click(chromedp.CSS(`#letters td.id a`)), chromedp.WaitVisible(chromedp.CSS("#letter-id")))
	checkNoScriptRan(t, ctx, true)
	shot(t, ctx, "hostile")

	// The pages of jobs, schedules, workers and history (docs/img).
	do(t, ctx, chromedp.Navigate(srv.URL+"/jobs?q=emails"), chromedp.WaitVisible(chromedp.CSS("#jobs")))
	shot(t, ctx, "jobs")
	do(t, ctx, chromedp.Click(chromedp.CSS("#jobs tr.job td.mono a")), chromedp.WaitVisible(chromedp.CSS("#status")))
	shot(t, ctx, "job")
	do(t, ctx, chromedp.Navigate(srv.URL+"/jobs?q=notifications&state=scheduled&source=broker"), chromedp.WaitVisible(chromedp.CSS("#jobs")))
	shot(t, ctx, "jobs-broker")
	do(t, ctx, chromedp.Navigate(srv.URL+"/schedules"), chromedp.WaitVisible(chromedp.CSS("#schedules")))
	shot(t, ctx, "schedules")
	do(t, ctx, chromedp.Navigate(srv.URL+"/workers"), chromedp.WaitVisible(chromedp.CSS("#workers")))
	shot(t, ctx, "workers")
	waitFor(t, "the history", func() bool { h, _ := p.History(context.Background(), time.Now().Add(-time.Hour)); return len(h) > 0 })
	do(t, ctx, chromedp.Navigate(srv.URL+"/history"), chromedp.WaitVisible(chromedp.CSS("#history-totals")))
	shot(t, ctx, "history")
	waitFor(t, "the workflow's pack step", func() bool {
		st, _ := p.WorkflowStatus(context.Background(), wf.ID)
		for _, s := range st.Steps {
			if s.Name == "pack" && s.State == "succeeded" {
				return true
			}
		}
		return false
	})
	do(t, ctx, chromedp.Navigate(srv.URL+"/workflow?id="+wf.ID), chromedp.WaitVisible(chromedp.CSS("#steps")))
	shot(t, ctx, "workflow")
}
