package dashboard

import (
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// SetClock makes the Recorder read the time from now.
func (rec *Recorder) SetClock(now func() time.Time) { rec.now = now }

// Sample records depths as if a page had read them at t.
func (d *Dashboard) Sample(queue string, s ap.QueueStats, t time.Time) { d.samples.add(queue, s, t) }
