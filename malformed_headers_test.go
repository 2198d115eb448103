package rowactor_test

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestMalformedHeadersAreReportedNotDropped: a headers column that is not a JSON object of
// strings (written by hand, or by another program) is read as far as it can be, values
// of other types as their JSON text, and logged as a warning naming the table, queue, id
// and what was wrong: once per delivery, however often the handler reads its headers. A
// well-formed column logs nothing. PostgreSQL and MySQL store only valid JSON in their
// JSON columns, so text that is no JSON at all is tried on SQLite.
func TestMalformedHeadersAreReportedNotDropped(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease)
			b := h.broker()
			type row struct {
				raw       string            // the headers column as written
				want      map[string]string // what Headers returns
				logs      int               // warnings: one per delivery
				errSubstr string            // in the warning's error
			}
			rows := []*row{
				{raw: `{"k":"v"}`, want: map[string]string{"k": "v"}},
				{raw: `{"a":1,"b":{"c":2},"s":"x"}`, want: map[string]string{"a": "1", "b": `{"c":2}`, "s": "x"}, logs: 1,
					errSubstr: `the headers \"a\", \"b\" are not strings`},
				{raw: `{"n":null,"t":true}`, want: map[string]string{"n": "null", "t": "true"}, logs: 1, errSubstr: `\"n\", \"t\"`},
				// Delivered twice (its handler retries once): logged for each delivery.
				{raw: `[1,2]`, logs: 2, errSubstr: "not a JSON object but an array"},
			}
			if drv.name == "sqlite" {
				rows = append(rows, &row{raw: `{bad`, logs: 1, errSubstr: "not a JSON object ({bad)"})
			}
			byID := map[int64]*row{}
			ids := h.publish(b, len(rows))
			for i, r := range rows {
				h.exec(fmt.Sprintf("UPDATE %s SET headers = ? WHERE id = ?", h.table.Name), r.raw, ids[i])
				byID[ids[i]] = r
			}

			var mu sync.Mutex
			got := map[int64][]map[string]string{}
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				first := d.Headers()
				for range 3 {
					if again := d.Headers(); !maps.Equal(again, first) {
						t.Errorf("row %d: Headers changed between calls: %v, then %v", d.ID(), first, again)
					}
					_ = d.Header("a")
				}
				mu.Lock()
				got[d.ID()] = append(got[d.ID()], first)
				mu.Unlock()
				if byID[d.ID()].raw == `[1,2]` && d.Attempt() == 1 {
					return rowactor.Retry()
				}
				return rowactor.Ack()
			}, rowactor.Lease(time.Minute))
			deliveries := 0
			for _, r := range rows {
				deliveries += max(r.logs, 1)
			}
			for _, s := range h.waitSettled(deliveries) {
				if s.Err != nil {
					t.Fatalf("settlement %+v", s)
				}
			}

			warned := map[int64]int{}
			idAttr := regexp.MustCompile(` id=(\d+) `)
			for _, line := range strings.Split(h.logs.String(), "\n") {
				if !strings.Contains(line, "headers column is malformed") {
					continue
				}
				m := idAttr.FindStringSubmatch(line)
				if m == nil || !strings.Contains(line, "level=WARN") || !strings.Contains(line, " table="+h.table.Name+" ") ||
					!strings.Contains(line, " queue="+h.queue+" ") || !strings.Contains(line, " error=") {
					t.Fatalf("warning without level WARN, table, queue, id and error: %s", line)
				}
				id, _ := strconv.ParseInt(m[1], 10, 64)
				r := byID[id]
				if r == nil || !strings.Contains(line, r.errSubstr) {
					t.Errorf("row %d: warning %s; want one with %q", id, line, r.errSubstr)
				}
				warned[id]++
			}
			for id, r := range byID {
				if warned[id] != r.logs {
					t.Errorf("row %d (headers %s): %d warnings, want %d\nlogs:\n%s", id, r.raw, warned[id], r.logs, h.logs.String())
				}
				for _, hs := range got[id] {
					if !maps.Equal(hs, r.want) || (hs == nil) != (r.want == nil) {
						t.Errorf("row %d (headers %s): Headers() = %#v, want %#v", id, r.raw, hs, r.want)
					}
				}
			}
		})
	}
}
