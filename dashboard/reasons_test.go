package dashboard_test

import (
	"os"
	"strings"
	"testing"

	ap "github.com/asyncplatform/asyncplatform"
)

// TestReasonFilterOffersEveryReason ties the queue page's reason filter and
// the style sheet's reason classes to ap.Reasons.
func TestReasonFilterOffersEveryReason(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	_, body := newClient(t, f).get("/queue?q=mail")
	css, err := os.ReadFile("static/app.css")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ap.Reasons() {
		if !strings.Contains(body, `<option value="`+string(r)+`">`) {
			t.Errorf("the reason filter does not offer %s", r)
		}
		if !strings.Contains(string(css), ".reason-"+string(r)+",") {
			t.Errorf("app.css has no class reason-%s", r)
		}
	}
}

// A queue opened by a name the backend does not hold says so, instead of
// showing an empty queue without a word.
func TestUnknownQueuePage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	c := newClient(t, f)
	if _, body := c.get("/queue?q=mial"); !strings.Contains(body, `id="unknown-queue"`) || !strings.Contains(body, "The backend holds no queue mial") {
		t.Errorf("the page of an unknown queue does not say so:\n%s", body)
	}
	if _, body := c.get("/queue?q=mail"); strings.Contains(body, `id="unknown-queue"`) {
		t.Errorf("the page of a known queue says it is unknown")
	}
}
