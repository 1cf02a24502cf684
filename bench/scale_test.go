package main

import (
	"bufio"
	"fmt"
	"os"
	"testing"
	"time"
)

// fakeStopDelay is how long a fake worker takes to stop once its stdin
// closes.
const fakeStopDelay = 5 * time.Second

// TestMain makes this test binary a fake worker when drainWithWorkers
// re-executes it: it says "ready", handles every job on "go", and when its
// stdin closes reports as its "cpu" the time since "go", then takes
// fakeStopDelay to stop.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "-worker" {
		fakeWorker()
		return
	}
	os.Exit(m.Run())
}

func fakeWorker() {
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() {
		return
	}
	start := time.Now()
	fmt.Println(fakeJobs)
	for in.Scan() {
	}
	fmt.Printf("cpu %d\n", time.Since(start).Microseconds())
	time.Sleep(fakeStopDelay)
}

// fakeJobs is how many jobs each fake worker says it handled.
const fakeJobs = 100

// TestDrainStopsWorkersAtOnce: every worker is told to stop at the same
// moment, so none runs on while another stops. Stopped one after another,
// worker i would run on for i×fakeStopDelay, counted in its reported time.
func TestDrainStopsWorkersAtOnce(t *testing.T) {
	const k = 4
	d, cpu, err := drainWithWorkers(workerSpec{System: "fake"}, k, k*fakeJobs)
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 {
		t.Errorf("drain time %v, want > 0", d)
	}
	// Stopped at once, the four report about the drain's length each;
	// one after another, at least (1+2+3)×fakeStopDelay in all.
	if cpu <= 0 || cpu >= 2*fakeStopDelay {
		t.Errorf("workers reported %v in all from go to stop, want more than 0 and less than %v", cpu, 2*fakeStopDelay)
	}
}
