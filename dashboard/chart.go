package dashboard

import (
	"fmt"
	"html/template"
	"strings"

	"github.com/rowactor/rowactor"
)

// chart is a throughput chart rendered as inline SVG on the server: no script, no
// library. Each minute is a bar of handled rows with the failed ones stacked on top.
type chart struct {
	Source          string
	Handled, Failed int64
	Peak            int64
	SVG             template.HTML
}

const (
	chartW, chartH = 240, 40
	barW           = chartW / rowactor.ThroughputMinutes
)

func newChart(source string, minutes []rowactor.ThroughputMinute) *chart {
	c := &chart{Source: source}
	for _, m := range minutes {
		c.Handled += m.Handled
		c.Failed += m.Failed
		c.Peak = max(c.Peak, m.Handled+m.Failed)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="handled and failed per minute, last hour: %d handled, %d failed">`,
		chartW, chartH, chartW, chartH, c.Handled, c.Failed)
	fmt.Fprintf(&b, `<rect class="bg" x="0" y="0" width="%d" height="%d"/>`, chartW, chartH)
	for i, m := range minutes {
		if c.Peak == 0 {
			break
		}
		x := i * barW
		hh := int(m.Handled * (chartH - 2) / c.Peak)
		fh := int(m.Failed * (chartH - 2) / c.Peak)
		if m.Handled > 0 && hh == 0 {
			hh = 1
		}
		if m.Failed > 0 && fh == 0 {
			fh = 1
		}
		title := fmt.Sprintf("%s: %d handled, %d failed", m.Minute.Format("15:04"), m.Handled, m.Failed)
		fmt.Fprintf(&b, `<g><title>%s</title>`, template.HTMLEscapeString(title))
		if hh > 0 {
			fmt.Fprintf(&b, `<rect class="ok" x="%d" y="%d" width="%d" height="%d"/>`, x, chartH-hh, barW-1, hh)
		}
		if fh > 0 {
			fmt.Fprintf(&b, `<rect class="failed" x="%d" y="%d" width="%d" height="%d"/>`, x, chartH-hh-fh, barW-1, fh)
		}
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	c.SVG = template.HTML(b.String()) // built above from numbers and escaped text only
	return c
}
