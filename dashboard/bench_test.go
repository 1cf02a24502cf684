package dashboard_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/dashboard"
)

// benchDead is how many dead letters BenchmarkDeadLetters100k lists.
const benchDead = 100_000

var (
	nextRE  = regexp.MustCompile(`href="([^"]+)" id="next-page"`)
	jobIDRE = regexp.MustCompile(`>(job-\d{6})</a>`)
)

// BenchmarkDeadLetters100k puts 100,000 dead letters in a queue on the
// machine's Redis (through the platform: jobs whose handler fails for good),
// then measures the dashboard's pages over HTTP:
//
//	FirstPage          the queue's page with its first 50 dead letters
//	FirstPageFiltered  the same, filtered by type (every other record matches)
//	LastMatch          a text filter only the newest record matches: one
//	                   request looks through the whole queue
//	PageToEnd          following "Next" from the first page to the last,
//	                   500 a page: every record is listed once
//
// go test -run '^$' -bench DeadLetters100k -benchtime 20x ./dashboard
func BenchmarkDeadLetters100k(b *testing.B) {
	f := newFixture(b, fixtureOptions{url: realRedis(b), queues: []string{"big"}, config: dashboard.Config{ScanTime: time.Minute, ScanLimit: 2 * benchDead}})
	start := time.Now()
	jobs := make([]*ap.Job, 0, benchDead)
	for i := range benchDead {
		typ := "fail.email"
		if i%2 == 1 {
			typ = "fail.sms"
		}
		jobs = append(jobs, &ap.Job{ID: fmt.Sprintf("job-%06d", i), Type: typ, Payload: fmt.Appendf(nil, `{"to":"user%d@example.com","n":%d}`, i, i),
			Headers: map[string]string{"tenant": "acme"}})
	}
	f.enqueue("big", benchDead, jobs...)
	b.Logf("%d dead letters made in %v", benchDead, time.Since(start).Round(time.Millisecond))
	hc := &http.Client{}

	get := func(b *testing.B, path string) string {
		resp, err := hc.Get(f.base + path)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d, %v", path, resp.StatusCode, err)
		}
		return string(body)
	}
	// page measures one page, which must list want dead letters and hold
	// the text has (the order of the records is the order the workers
	// dead-lettered them in, not the IDs').
	page := func(name, path string, want int, has string) {
		b.Run(name, func(b *testing.B) {
			var worst time.Duration
			for b.Loop() {
				t0 := time.Now()
				body := get(b, path)
				worst = max(worst, time.Since(t0))
				if n := len(jobIDRE.FindAllString(body, -1)); n != want || !strings.Contains(body, has) {
					b.Fatalf("GET %s: %d dead letters listed, want %d, with %q", path, n, want, has)
				}
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
		})
	}
	page("FirstPage", "/queue?q=big", 50, "Records 1–50 of 100,000")
	page("FirstPageFiltered", "/queue?q=big&type=fail.sms", 50, "50 dead letters matching type fail.sms")
	page("LastMatch", "/queue?q=big&text="+url.QueryEscape(`"n":99999}`), 1, "job-099999")

	b.Run("PageToEnd", func(b *testing.B) {
		for b.Loop() {
			t0 := time.Now()
			pages := 0
			seen := make(map[string]bool, benchDead)
			for next := "/queue?q=big&n=500"; next != ""; pages++ {
				body := get(b, next)
				for _, m := range jobIDRE.FindAllStringSubmatch(body, -1) {
					id := m[1]
					if seen[id] {
						b.Fatalf("%s listed twice", id)
					}
					seen[id] = true
				}
				next = ""
				if m := nextRE.FindStringSubmatch(body); m != nil {
					next = strings.ReplaceAll(strings.TrimPrefix(m[1], f.srv.URL), "&amp;", "&")
				}
			}
			if len(seen) != benchDead || !seen[fmt.Sprintf("job-%06d", benchDead-1)] {
				b.Fatalf("paging listed %d records over %d pages; want all %d", len(seen), pages, benchDead)
			}
			b.ReportMetric(float64(pages), "pages")
			b.ReportMetric(float64(time.Since(t0).Microseconds())/1000/float64(pages), "ms/page")
		}
	})
}

// BenchmarkNestedJSONPage measures the page of a dead letter whose payload
// is issue 34's 30 KB of nested arrays, as any viewer can ask for it, one
// view and three at a time: the time of a round, the page's size, and the
// peak of the heap (sampled every millisecond) above where it started.
//
// go test -run '^$' -bench NestedJSONPage -benchtime 20x ./dashboard
func BenchmarkNestedJSONPage(b *testing.B) {
	f := newFixture(b, fixtureOptions{queues: []string{"mail"}})
	payload := []byte(strings.Repeat("[", 9990) + strings.Repeat("1,", 4999) + "1" + strings.Repeat("]", 9990))
	f.enqueue("mail", 1, &ap.Job{Type: "fail.nested", Payload: payload})
	path := f.base + "/letter?q=mail&id=" + url.QueryEscape(f.deadLetters("mail")[0].ID)
	hc := &http.Client{}
	for _, views := range []int{1, 3} {
		b.Run(fmt.Sprintf("views=%d", views), func(b *testing.B) {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			start := ms.HeapAlloc
			var peak atomic.Uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				var ms runtime.MemStats
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
					runtime.ReadMemStats(&ms)
					if ms.HeapAlloc > peak.Load() {
						peak.Store(ms.HeapAlloc)
					}
				}
			}()
			var size atomic.Int64
			var worst time.Duration
			for b.Loop() {
				t0 := time.Now()
				var wg sync.WaitGroup
				for range views {
					wg.Go(func() {
						resp, err := hc.Get(path)
						if err != nil {
							b.Error(err)
							return
						}
						defer resp.Body.Close()
						n, _ := io.Copy(io.Discard, resp.Body)
						size.Store(n)
					})
				}
				wg.Wait()
				worst = max(worst, time.Since(t0))
			}
			close(stop)
			<-sampled
			b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
			b.ReportMetric(float64(size.Load())/1024, "page-KiB")
			b.ReportMetric(float64(peak.Load()-min(peak.Load(), start))/(1<<20), "peak-heap-MiB")
		})
	}
}
