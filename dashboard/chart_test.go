package dashboard

import (
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// The chart draws a bar per minute with counts, scaled to the hour's busiest minute, the
// failed stacked on the handled, and keeps every minute's numbers in its title.
func TestChart(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)
	minutes := make([]rowactor.ThroughputMinute, rowactor.ThroughputMinutes)
	for i := range minutes {
		minutes[i].Minute = t0.Add(time.Duration(i) * time.Minute)
	}
	minutes[10].Handled, minutes[10].Failed = 30, 8 // the peak: 38
	minutes[59].Handled = 1                         // tiny, still drawn
	c := newChart("test", minutes)
	svg := string(c.SVG)
	if c.Handled != 31 || c.Failed != 8 || c.Peak != 38 {
		t.Errorf("totals %+v", c)
	}
	for _, want := range []string{
		`<title>03:10: 30 handled, 8 failed</title><rect class="ok" x="40" y="10" width="3" height="30"/><rect class="failed" x="40" y="2" width="3" height="8"/>`,
		`<title>03:59: 1 handled, 0 failed</title><rect class="ok" x="236" y="39" width="3" height="1"/>`,
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %s:\n%s", want, svg)
		}
	}
	if n := strings.Count(svg, "<rect"); n != 4 { // the background and three bars
		t.Errorf("%d rects, want 4", n)
	}
	if empty := string(newChart("none", minutes[:0]).SVG); strings.Count(empty, "<rect") != 1 {
		t.Errorf("an empty hour draws bars: %s", empty)
	}
}
