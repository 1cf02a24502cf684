package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// Redriving a job that is dead-lettered again at once deletes only the old
// record.
func TestRedriveKeepsTheNewRecord(t *testing.T) {
	p := startPlatform(t, Config{}, map[string]Handler{"t": func(context.Context, *Job) error {
		return Permanent(errors.New("always"))
	}})
	ctx := context.Background()
	_ = p.Enqueue(ctx, &Job{ID: "j1", Type: "t"})
	waitUntil(t, "the first dead letter", func() bool { pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 10); return len(pg.Letters) == 1 })
	first, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
	if n, err := p.Redrive(ctx, DefaultQueue, "j1"); n != 1 || err != nil {
		t.Fatalf("Redrive: %d, %v", n, err)
	}
	waitUntil(t, "the second dead letter", func() bool {
		pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
		return len(pg.Letters) == 1 && pg.Letters[0].ID != first.Letters[0].ID
	})
}

func TestNextDeadLetterPayloadsAreCopies(t *testing.T) {
	p := startPlatform(t, Config{}, map[string]Handler{"t": func(context.Context, *Job) error { return Invalid(errors.New("x")) }})
	ctx := context.Background()
	_ = p.Enqueue(ctx, &Job{Type: "t", Payload: []byte("abc")})
	waitUntil(t, "a dead letter", func() bool { pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 10); return len(pg.Letters) == 1 })
	_ = p.NextDeadLetter(ctx, DefaultQueue, func(_ context.Context, dl DeadLetter) (bool, error) {
		dl.Job.Payload[0] = 'Z'
		return false, nil
	})
	pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
	if !bytes.Equal(pg.Letters[0].Job.Payload, []byte("abc")) {
		t.Errorf("changing a dead letter's payload changed the stored record: %q", pg.Letters[0].Job.Payload)
	}
}
