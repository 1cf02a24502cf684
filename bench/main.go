// Command bench measures every asyncplatform backend against its broker's
// raw-client ceiling and against peer libraries, and writes the results as
// a Markdown table and a PNG chart.
//
// Run it from this directory (it is a module of its own, so the main module
// never depends on the peers):
//
//	go run .                       # everything, N = 10,000 jobs per phase, ~15 min on 2 cores
//	go run . -quick                # a smoke test: N = 1,000, short phases
//	go run . -backends redis,nats  # some backends only
//
// Flags:
//
//	-backends  comma-separated backends (memory, redis, rabbit, nats, azure, postgres)
//	-n         jobs per phase (Azure uses -azure-n: Azurite is slow)
//	-rate      offered jobs/s in the latency phase (Azure uses -azure-rate)
//	-quick     small N and short phases, for trying the tool
//	-out       where benchmarks.md and benchmarks.png go (default ../docs)
//	-throughput, -peers, -scale, -depth, -store, -unique, -limits, -features  turn those parts off with =false
//	-churn     measure a rate-limited backlog's Redis commands (off by default: give -redis a server of its own)
//	-only      run only the parts named, e.g. -only limits (or relay: the outbox relay, PostgreSQL to Redis, RabbitMQ, NATS; workflow: the cost per step and per edge)
//	-max-dead  the depth phase's points up to this many dead letters only
//	-scale-rounds  rounds of each process count in the scaling phase, ours and the raw loop alternating (medians)
//	-cpuprofile DIR  write a CPU profile of each facade run, and of each worker of the 4-process scaling runs (see go tool pprof)
//
// The brokers are the machine's: Redis 127.0.0.1:6379, RabbitMQ
// 127.0.0.1:5672 (guest/guest), NATS 127.0.0.1:4222 with JetStream. For
// Azure it uses ASYNCPLATFORM_AZURE_CONNECTION_STRING when set, and
// otherwise starts an Azurite of its own (installed by
// ../scripts/azurite.sh install) and stops it at the end. Every queue,
// stream or key it makes is named bench-… (Azure: prefix "bench") and
// removed after use.
//
// Each system (our facade, a raw loop, a peer) runs in a child process of
// its own (this binary, re-executed), so allocations and peak RSS are its
// alone; the scaling test re-executes it as worker processes too.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	gonats "github.com/nats-io/nats.go"
)

// options are the command's flags.
type options struct {
	Backends   []string
	N, AzureN  int
	AzureRate  int
	Quick      bool
	Out        string
	Throughput bool
	Peers      bool
	Scale      bool
	Depth      bool
	Store      bool
	StoreDur   time.Duration
	Unique     bool
	Limits     bool
	Features   bool
	FeatureSet string // the features measured, comma-separated names; empty: all
	Churn      bool
	Relay      bool
	Workflow   bool // the workflow rows (workflow.go)
	BigDepth   int
	MaxDead    int
	Rate       int
	LatencyDur time.Duration
	Profile    string
	Srv        servers
	// NATSCurrent is a second nats-server's URL (a current one, from
	// scripts/nats-current.sh): the NATS throughput systems run against it
	// too, reported as natsCurrentLabel. natsCurrentAuto starts one for
	// the run (startNATSCurrent); "off" or empty: none.
	NATSCurrent string
	// Prefetch, when positive, adds the system "ours-prefetch" to the
	// throughput phase: our facade with QueueConfig.Prefetch at Prefetch
	// times the concurrency.
	Prefetch int
	// ScaleRounds is how many times each process count is measured, ours
	// and the raw loop alternating; the report gives medians.
	ScaleRounds int
}

// natsCurrentLabel names the NATS results measured against -nats-current.
const natsCurrentLabel = "nats-current"

// natsCurrentAuto is the -nats-current value that has the bench start a
// current nats-server of its own for the run.
const natsCurrentAuto = "auto"

func main() {
	log.SetFlags(log.Ltime)
	log.SetPrefix("bench: ")
	var (
		o        options
		backends string
		child    string
		worker   string
		only     string
	)
	flag.StringVar(&backends, "backends", "memory,redis,rabbit,nats,azure,postgres", "comma-separated backends to measure")
	flag.IntVar(&o.N, "n", 10000, "jobs per phase")
	flag.IntVar(&o.AzureN, "azure-n", 1000, "jobs per phase on Azure (Azurite is slow)")
	flag.BoolVar(&o.Quick, "quick", false, "small N and short phases, to try the tool")
	flag.StringVar(&o.Out, "out", "../docs", "directory for benchmarks.md and benchmarks.png")
	flag.BoolVar(&o.Throughput, "throughput", true, "measure throughput and latency (the main tables)")
	flag.BoolVar(&o.Peers, "peers", true, "measure the peer libraries")
	flag.BoolVar(&o.Scale, "scale", true, "measure 1, 2 and 4 worker processes, ours and the raw loop")
	flag.IntVar(&o.ScaleRounds, "scale-rounds", 3, "rounds of each process count in the scaling phase (medians)")
	flag.BoolVar(&o.Depth, "depth", true, "measure costs at small and large queue depth")
	flag.BoolVar(&o.Store, "store", true, "measure each backend's store (Get, Create, CAS)")
	flag.BoolVar(&o.Unique, "unique", true, "measure what a unique key costs an enqueue")
	flag.BoolVar(&o.Limits, "limits", true, "measure cluster-wide limits: the rate achieved, the concurrency reached")
	flag.BoolVar(&o.Features, "features", true, "measure what each feature costs the processing rate when switched on")
	flag.StringVar(&o.FeatureSet, "feature-set", "", "the features phase measures only these, comma-separated (none, status, unique, cluster, rate); empty: all")
	flag.BoolVar(&o.Relay, "relay", true, "measure the outbox relay from PostgreSQL to Redis, RabbitMQ and NATS")
	flag.BoolVar(&o.Workflow, "workflow", true, "measure what a workflow step and a dependency edge cost")
	flag.BoolVar(&o.Churn, "churn", false, "measure the Redis commands a backlog held back by a rate costs (give -redis a server of its own)")
	flag.StringVar(&only, "only", "", "run only these parts, comma-separated: throughput, scale, depth, store, unique, limits, features, churn, relay, workflow")
	flag.DurationVar(&o.StoreDur, "store-time", 5*time.Second, "length of each store operation's run")
	flag.StringVar(&o.Srv.Postgres, "postgres", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL (RabbitMQ's companion store; the PostgreSQL backend, its raw loop, and River in the database bench_river beside it)")
	flag.IntVar(&o.BigDepth, "big-depth", 1000000, "the large queue depth on memory and Redis")
	flag.IntVar(&o.MaxDead, "max-dead", 0, "measure only the depth points with at most this many dead letters (0: all)")
	flag.IntVar(&o.Rate, "rate", 1000, "offered jobs/s in the latency phase")
	flag.IntVar(&o.AzureRate, "azure-rate", 100, "offered jobs/s in the latency phase on Azure")
	flag.DurationVar(&o.LatencyDur, "latency", 5*time.Second, "length of the latency phase")
	flag.StringVar(&o.Profile, "cpuprofile", "", "directory for a CPU profile of each of our facade's runs (ours-<backend>.pprof)")
	flag.StringVar(&o.Srv.Redis, "redis", "127.0.0.1:6379", "Redis address")
	flag.StringVar(&o.Srv.AMQP, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	flag.StringVar(&o.Srv.NATS, "nats", "nats://127.0.0.1:4222", "NATS URL")
	flag.StringVar(&o.NATSCurrent, "nats-current", natsCurrentAuto, "NATS throughput is measured against a current nats-server too: \"auto\" builds (once) and starts one (../scripts/nats-current.sh), a URL names a running one, \"off\" skips it")
	flag.IntVar(&o.Prefetch, "prefetch", 0, "also measure our facade with Prefetch this many times the concurrency (system ours-prefetch; 0: not)")
	flag.StringVar(&child, "child", "", "internal: run one system (JSON spec) and print its result")
	flag.StringVar(&worker, "worker", "", "internal: run as a worker process (JSON spec)")
	flag.Parse()
	o.Backends = strings.Split(backends, ",")
	if only != "" {
		parts := map[string]*bool{"throughput": &o.Throughput, "scale": &o.Scale, "depth": &o.Depth,
			"store": &o.Store, "unique": &o.Unique, "limits": &o.Limits, "features": &o.Features, "churn": &o.Churn, "relay": &o.Relay, "workflow": &o.Workflow}
		for _, on := range parts {
			*on = false
		}
		for _, name := range strings.Split(only, ",") {
			on, ok := parts[name]
			if !ok {
				log.Fatalf("-only: unknown part %q", name)
			}
			*on = true
		}
	}
	o.Srv.Azure = os.Getenv("ASYNCPLATFORM_AZURE_CONNECTION_STRING")

	switch {
	case child != "":
		runChild(child)
		return
	case worker != "":
		runWorker(worker)
		return
	}
	if err := checkNATSCurrent(o.NATSCurrent); err != nil {
		log.Fatal(err)
	}
	if o.Quick {
		o.N, o.AzureN, o.LatencyDur, o.BigDepth, o.StoreDur = 1000, 300, time.Second, 10000, time.Second
	}
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

// childSpec tells a child process what to measure.
type childSpec struct {
	Backend, System string
	Plan            plan
	Srv             servers
	Profile         string        // a CPU profile's path, or ""
	StoreDur        time.Duration // each store operation's run (System "store")
	Feature         string        // the feature measured (System "features")
	Prefetch        int           // System "ours-prefetch": Prefetch as a multiple of the concurrency
}

// run measures everything o asks for and writes the report.
func run(o options) error {
	start := time.Now()
	rep := &report{Options: o, Start: start.UTC()}
	rep.Machine = describeMachine(o.Srv)
	if contains(o.Backends, "azure") && o.Srv.Azure == "" {
		stop, conn, err := startAzurite()
		if err != nil {
			log.Printf("azure: %v", err)
			rep.Notes = append(rep.Notes, fmt.Sprintf("Azure skipped: %v", err))
		} else {
			defer stop()
			o.Srv.Azure = conn
			rep.Options.Srv.Azure = conn
		}
	}
	if o.NATSCurrent == "off" {
		o.NATSCurrent = ""
	}
	if o.NATSCurrent != "" && !(o.Throughput && contains(o.Backends, "nats")) {
		if o.NATSCurrent != natsCurrentAuto {
			log.Printf("-nats-current %s: not used: the run measures no NATS throughput", o.NATSCurrent)
		}
		o.NATSCurrent = ""
	}
	rep.Options.NATSCurrent = ""
	if o.Profile != "" {
		if err := os.MkdirAll(o.Profile, 0o755); err != nil {
			return err
		}
	}
	rep.LoadBefore = loadAvg()
	for _, b := range o.Backends {
		if !o.Throughput {
			break
		}
		n, rate := o.N, o.Rate
		if b == "azure" {
			n, rate = o.AzureN, o.AzureRate
		}
		p := plan{
			N: n, Concs: []int{10, 50}, Rate: rate, LatencyDur: o.LatencyDur,
			Producers: 10, PhaseLimit: 3 * time.Minute,
		}
		if o.Quick {
			p.PhaseLimit = time.Minute
		}
		systems := []string{"ours", "raw1", "rawbatch"}
		if o.Prefetch > 0 {
			systems = slices.Insert(systems, 1, "ours-prefetch")
		}
		if o.Peers {
			for _, pr := range peers {
				if pr.backend == b {
					systems = append(systems, pr.name)
				}
			}
		}
		for _, s := range systems {
			spec := childSpec{Backend: b, System: s, Plan: p, Srv: o.Srv, Prefetch: o.Prefetch}
			if o.Profile != "" && s == "ours" {
				spec.Profile, _ = filepath.Abs(filepath.Join(o.Profile, "ours-"+b+".pprof"))
			}
			r := runSystem(spec, 4*p.PhaseLimit+time.Minute)
			log.Printf("%s/%s: %s", b, s, r.summary())
			rep.Results = append(rep.Results, r)
		}
		if b == "nats" && o.NATSCurrent != "" {
			measureNATSCurrent(rep, o, p, systems)
		}
	}
	if o.Scale {
		for _, b := range o.Backends {
			if b == "memory" || b == "postgres" || (b == "azure" && o.Srv.Azure == "") {
				continue
			}
			n := o.N
			if b == "azure" {
				n = o.AzureN
			}
			s := measureScale(b, n, o.ScaleRounds, o.Profile, o.Srv)
			log.Printf("%s scaling: %s", b, s.summary())
			rep.Scale = append(rep.Scale, s)
		}
	}
	if o.Depth {
		for _, b := range o.Backends {
			if b == "azure" && o.Srv.Azure == "" {
				continue
			}
			for _, d := range depthsFor(b, o) {
				if o.MaxDead > 0 && d.Dead > o.MaxDead {
					continue
				}
				dr := measureDepth(b, d, o.Srv)
				log.Printf("%s depth %d/%d: %s", b, d.Work, d.Dead, dr.summary())
				rep.Depth = append(rep.Depth, dr)
			}
		}
	}
	if o.Store {
		rep.Store = measureStores(o)
	}
	if o.Unique {
		rep.Unique = measureUniques(o)
	}
	if o.Limits {
		rep.Limits = measureLimits(o)
	}
	if o.Features {
		rep.Features = measureFeatures(o)
	}
	if o.Churn {
		rep.Churn = measureChurn(o)
	}
	if o.Workflow {
		rep.Workflow = measureWorkflows(o)
	}
	if o.Relay {
		rep.Relay = measureRelays(o)
	}
	rep.LoadAfter = loadAvg()
	if left := leftovers(o.Srv); len(left) > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("left on the brokers (a bug of this tool): %s", strings.Join(left, ", ")))
	}
	rep.Elapsed = time.Since(start)
	return rep.write(o.Out)
}

// runSystem runs one system in a child process and returns its result.
func runSystem(spec childSpec, limit time.Duration) result {
	r := result{Backend: spec.Backend, System: spec.System}
	if err := runJSONChild(spec, limit, &r); err != nil {
		r.Err = err.Error()
	}
	return r
}

// runChild measures one system and prints its result as JSON.
func runChild(js string) {
	var spec childSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		log.Fatal(err)
	}
	if spec.System == storeSystem {
		runStoreChild(spec)
		return
	}
	if spec.System == uniqueSystem {
		runUniqueChild(spec)
		return
	}
	if spec.System == workflowSystem {
		runWorkflowChild(spec)
		return
	}
	if spec.System == limitsSystem {
		runLimitsChild(spec)
		return
	}
	if spec.System == featuresSystem {
		runFeaturesChild(spec)
		return
	}
	start := time.Now()
	r := result{Backend: spec.Backend, System: spec.System, Load: loadAvg()}
	ctx := context.Background()
	s, note, err := openSystem(ctx, spec)
	r.Note = note
	if err != nil {
		r.Err = err.Error()
	} else {
		if spec.Profile != "" {
			if f, err := os.Create(spec.Profile); err == nil {
				pprof.StartCPUProfile(f)
				defer f.Close()
			}
		}
		measure(ctx, s, spec.Plan, &r)
		pprof.StopCPUProfile()
		if err := s.close(); err != nil && r.Err == "" {
			r.Err = "cleanup: " + err.Error()
		}
	}
	r.RSSMiB = peakRSS()
	r.Seconds = time.Since(start).Seconds()
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

// openSystem opens the system a spec names, on queues named after it and
// this process.
func openSystem(ctx context.Context, spec childSpec) (system, string, error) {
	tag := fmt.Sprintf("%s-%d", spec.System, os.Getpid())
	switch spec.System {
	case "ours":
		s, err := newFacade(ctx, spec.Backend, tag, spec.Srv)
		return s, "", err
	case "ours-prefetch":
		s, err := newFacade(ctx, spec.Backend, tag, spec.Srv)
		if err != nil {
			return nil, "", err
		}
		s.prefetch = spec.Prefetch
		return s, fmt.Sprintf("our facade with Prefetch %d× the concurrency", spec.Prefetch), nil
	case "raw1":
		s, err := newRaw(ctx, spec.Backend, tag, 1, spec.Srv)
		return s, rawNotes[spec.Backend][0], err
	case "rawbatch":
		s, err := newRaw(ctx, spec.Backend, tag, rawBatch[spec.Backend], spec.Srv)
		return s, rawNotes[spec.Backend][1], err
	}
	for _, p := range peers {
		if p.name == spec.System && p.backend == spec.Backend {
			s, err := p.open(ctx, tag, spec.Srv)
			return s, p.note, err
		}
	}
	return nil, "", fmt.Errorf("unknown system %q on %s", spec.System, spec.Backend)
}

// rawBatch is the batch size of each batched raw loop.
var rawBatch = map[string]int{"memory": 32, "redis": 10, "rabbit": 10, "nats": 64, "azure": 32, "postgres": 10, "sqlite": 32}

// rawNotes say what each raw loop does (one per round trip, batched).
var rawNotes = map[string][2]string{
	"memory": {"the memory driver without the platform: Receive(1), Ack", "Receive(32), Ack each"},
	"redis":  {"go-redis: LPUSH; BLMOVE to a processing list, LREM to ack", "LPUSH of 100; pipelined LMOVE ×10, pipelined LREM"},
	"rabbit": {"amqp091-go: quorum queue, persistent, confirm per publish; prefetch 2c, ack each", "100 publishes then their confirms; ack multiple every c"},
	"nats":   {"nats.go jetstream: work-queue stream on file; sync publish; Fetch(1), double ack", "100 async publishes; Fetch(64), double ack each"},
	"azure":  {"azqueue: base64 text, TTL -1; dequeue 1, delete", "dequeue 32, delete each (no batch send in Azure)"},
	"postgres": {"pgx: committed INSERT; claim UPDATE (lease, count) of 1 row picked FOR UPDATE SKIP LOCKED; committed DELETE; idle poll 5 ms",
		"INSERT of 100 (unnest); claim of 10 rows; one DELETE of the 10"},
	"sqlite": {"the sqlite driver without the platform: Receive(1), Ack", "Receive(32), Ack each"},
}

// startAzurite starts an Azurite of our own on a free port; stop ends it.
func startAzurite() (stop func(), conn string, err error) {
	install := exec.Command("../scripts/azurite.sh", "install")
	install.Stderr = os.Stderr
	if err := install.Run(); err != nil {
		return nil, "", fmt.Errorf("installing Azurite: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	blobPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	const account = "devstoreaccount1"
	const key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
	// The queue service, and the blob service for the backend's dead letters.
	cmd := exec.Command("../.tools/azurite/node_modules/.bin/azurite",
		"--queueHost", "127.0.0.1", "--queuePort", fmt.Sprint(port),
		"--blobHost", "127.0.0.1", "--blobPort", fmt.Sprint(blobPort), "--tableHost", "127.0.0.1", "--tablePort", "0",
		"--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent")
	cmd.Env = append(os.Environ(), "AZURITE_ACCOUNTS="+account+":"+key)
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("starting Azurite: %w", err)
	}
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	addr, blobAddr := fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.1:%d", blobPort)
	for i := 0; ; i++ {
		if dialOK(addr) && dialOK(blobAddr) {
			break
		}
		if i == 600 {
			stop()
			return nil, "", errors.New("the Azurite emulator did not listen within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	conn = fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;QueueEndpoint=http://%s/%s;BlobEndpoint=http://%s/%s;", account, key, addr, account, blobAddr, account)
	return stop, conn, nil
}

// measureNATSCurrent runs the NATS throughput systems against the current
// nats-server (o.NATSCurrent: a URL, or natsCurrentAuto to start one for
// these runs only), reported as natsCurrentLabel.
func measureNATSCurrent(rep *report, o options, p plan, systems []string) {
	url := o.NATSCurrent
	if url == natsCurrentAuto {
		stop, u, version, err := startNATSCurrent()
		if err != nil {
			log.Printf("%s: %v", natsCurrentLabel, err)
			rep.Notes = append(rep.Notes, fmt.Sprintf("NATS against a current nats-server skipped: %v", err))
			return
		}
		defer stop()
		url = u
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: nats-server %s, built from the Go module proxy by scripts/nats-current.sh and started by the bench for these runs only (JetStream, file storage in a temporary directory), on %s.", natsCurrentLabel, version, url))
	}
	rep.Options.NATSCurrent = url
	srv := o.Srv
	srv.NATS = url
	for _, s := range systems {
		spec := childSpec{Backend: "nats", System: s, Plan: p, Srv: srv, Prefetch: o.Prefetch}
		if o.Profile != "" && s == "ours" {
			spec.Profile, _ = filepath.Abs(filepath.Join(o.Profile, "ours-"+natsCurrentLabel+".pprof"))
		}
		r := runSystem(spec, 4*p.PhaseLimit+time.Minute)
		r.Backend = natsCurrentLabel
		log.Printf("%s/%s: %s", natsCurrentLabel, s, r.summary())
		rep.Results = append(rep.Results, r)
	}
	i := slices.Index(rep.Options.Backends, "nats")
	rep.Options.Backends = slices.Insert(slices.Clone(rep.Options.Backends), i+1, natsCurrentLabel)
}

// checkNATSCurrent refuses a -nats-current value that is neither
// natsCurrentAuto, "off", empty, nor a nats:// or tls:// URL.
func checkNATSCurrent(v string) error {
	switch {
	case v == "", v == "off", v == natsCurrentAuto:
		return nil
	case strings.HasPrefix(v, "nats://"), strings.HasPrefix(v, "tls://"):
		return nil
	}
	return fmt.Errorf("-nats-current: %q is not auto, off or a nats:// (tls://) URL", v)
}

// startNATSCurrent builds the current nats-server once
// (../scripts/nats-current.sh, from the Go module proxy; later runs reuse
// the binary) and starts it on a free loopback port with JetStream on
// file storage in a temporary directory of its own. It returns the
// server's URL and version, and stop, which kills it and removes the
// directory.
func startNATSCurrent() (stop func(), url, version string, err error) {
	build := exec.Command("../scripts/nats-current.sh", "path")
	build.Stderr = os.Stderr
	out, err := build.Output()
	if err != nil {
		return nil, "", "", fmt.Errorf("building the current nats-server (../scripts/nats-current.sh path): %w", err)
	}
	bin := strings.TrimSpace(string(out))
	v, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return nil, "", "", fmt.Errorf("%s --version: %w", bin, err)
	}
	version = strings.TrimPrefix(strings.TrimSpace(string(v)), "nats-server: ")
	port, err := freePort()
	if err != nil {
		return nil, "", "", err
	}
	dir, err := os.MkdirTemp("", "bench-nats-current-")
	if err != nil {
		return nil, "", "", err
	}
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", dir)
	var stderr tailBuffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, "", "", fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop = func() {
		_ = cmd.Process.Kill()
		<-exited
		os.RemoveAll(dir)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	url = "nats://" + addr
	for i := 0; !dialOK(addr); i++ {
		select {
		case err := <-exited:
			exited <- err // for stop
			stop()
			return nil, "", "", fmt.Errorf("%s exited: %v: %s", bin, err, stderr.String())
		default:
		}
		if i == 300 {
			stop()
			return nil, "", "", fmt.Errorf("%s did not listen on %s within 30s: %s", bin, addr, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The port was free when chosen: check that the server answering on
	// it is the one started.
	nc, err := gonats.Connect(url)
	if err != nil {
		stop()
		return nil, "", "", fmt.Errorf("connecting to the started nats-server on %s: %w", addr, err)
	}
	got := nc.ConnectedServerVersion()
	nc.Close()
	if "v"+strings.TrimPrefix(got, "v") != version {
		stop()
		return nil, "", "", fmt.Errorf("the server on %s is nats-server %s, not the %s started there", addr, got, version)
	}
	return stop, url, version, nil
}

// tailBuffer keeps the last 2 KiB written to it: a child's output, for an
// error that says why it failed.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - 2048; over > 0 {
		t.b = t.b[over:]
	}
	return len(p), nil
}

// String returns what was kept, trimmed.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// loadAvg returns the 1-minute load average.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	fmt.Sscan(string(b), &l)
	return l
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// readLines sends each line of r to the returned channel.
func readLines(sc *bufio.Scanner) <-chan string {
	ch := make(chan string)
	go func() {
		defer close(ch)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}
