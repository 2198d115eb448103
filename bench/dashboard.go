package main

// -mode dashboard: what an open dashboard costs on a big table. PostgreSQL (-pg) only: a
// lease table of -dash-rows rows (default 1,000,000) as a table that keeps its finished
// rows looks after a while (all but 10,000 finished over the last two hours, every 13th
// with an error; the 10,000 queued spread over ten groups, some delayed, some leased), and
// the dashboard's overview and a job list page rendered -dash-n times each through its
// http.Handler (no network), with the time of each render after three warm-ups (the
// first render's time apart: it reads the chart's whole hour, later ones the last two
// minutes). Three cases: the table as
// Schema renders it (the chart's statement then reads the whole table: no index serves
// processed_at), with an index on processed_at for the chart, and the same
// table with every row queued (nothing finished: the counts read every row).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dashboard"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
)

type dashboardLine struct {
	Mode     string  `json:"mode"`
	DB       string  `json:"db"`
	Case     string  `json:"case"`
	Rows     int     `json:"rows"`
	Queued   int     `json:"queued"`
	Page     string  `json:"page"`
	N        int     `json:"n"`
	FirstMs  float64 `json:"first_ms"` // the first render: cold plans, connections and chart cache
	P50ms    float64 `json:"p50_ms"`
	P90ms    float64 `json:"p90_ms"`
	MaxMs    float64 `json:"max_ms"`
	Status   int     `json:"status"`
	BodySize int     `json:"body_bytes"`
	// The overview's count of a big queue runs in the background and is kept (the
	// dashboard's countCache): how long until a render showed numbers, how many timed
	// renders showed a kept count and how many of those while a recount ran, and how long
	// the slowest kept count took.
	UntilNumbersMs float64 `json:"until_numbers_ms,omitempty"`
	Kept           int     `json:"kept_renders"`
	Recounting     int     `json:"recounting_renders"`
	CountMs        int64   `json:"count_ms,omitempty"`
}

var (
	tookRE = regexp.MustCompile(`data-took-ms="(\d+)"`)
)

func runDashboard(ctx context.Context, cfg config, out *json.Encoder) error {
	b, err := rowactor.Open(ctx, cfg.pgURL, rowactor.WithPollOnly())
	if err != nil {
		return err
	}
	defer b.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck // the program's end
	pool := b.Dialect().(*postgres.Dialect).Pool()
	var r [5]byte
	_, _ = rand.Read(r[:])
	tb := rowactor.Table{Name: "bench_dash_" + hex.EncodeToString(r[:]), ID: "id", Payload: "payload", Group: "grp",
		Attempt: "attempt", RetryAfter: "retry_after", ProcessedAt: "processed_at", LockedUntil: "locked_until",
		Headers: "headers", Error: "error"}
	ddl, err := rowactor.Schema(b.Dialect(), tb)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+tb.Name) //nolint:errcheck // the program's end
	fill := func(finished int) error {
		if _, err := pool.Exec(ctx, "TRUNCATE "+tb.Name); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench dashboard: filling %d rows (%d finished)\n", cfg.dashRows, finished)
		_, err := pool.Exec(ctx, "INSERT INTO "+tb.Name+" (payload, grp, attempt, retry_after, processed_at, locked_until, error)"+
			" SELECT '\\x7b7d'::bytea, 'g' || (i % 10), 1 + i % 3,"+
			" CASE WHEN i > $2 AND i % 10 = 1 THEN $1::timestamptz + interval '1 hour' END,"+
			" CASE WHEN i <= $2 THEN $1::timestamptz - (i % 7200) * interval '1 second' END,"+
			" CASE WHEN i > $2 AND i % 10 = 2 THEN $1::timestamptz + interval '10 minutes' END,"+
			" CASE WHEN i % 13 = 0 THEN 'boom ' || (i % 3) END"+
			" FROM generate_series(1, $3::int) AS i", time.Now(), finished, cfg.dashRows)
		if err != nil {
			return err
		}
		_, err = pool.Exec(ctx, "VACUUM ANALYZE "+tb.Name)
		return err
	}
	measure := func(name string, queued int) error {
		// A dashboard of its own per case: its chart's cache starts empty, as a new
		// process's does, and the first render reads the hour of finished rows.
		d, err := dashboard.New(b, []dashboard.Table{{Table: tb, DeadLetters: map[string]string{"g0": "g9"}}})
		if err != nil {
			return err
		}
		for _, page := range []struct{ name, path string }{
			{"overview", "/"},
			{"job list", "/jobs?table=" + tb.Name + "&group=g3&state=due"},
		} {
			times := make([]float64, 0, cfg.dashN)
			var (
				last    *httptest.ResponseRecorder
				first   float64
				line    dashboardLine
				numbers bool // a render showed the overview's numbers
			)
			render := func() (time.Duration, error) {
				rec := httptest.NewRecorder()
				start := time.Now()
				d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, page.path, nil))
				took := time.Since(start)
				if rec.Code != http.StatusOK {
					return 0, fmt.Errorf("%s: status %d: %s", page.path, rec.Code, rec.Body.String())
				}
				last = rec
				return took, nil
			}
			// Warm-ups: the pool's connections and the plans (three renders), and, for
			// the overview, until a render shows the numbers rather than "counting".
			began := time.Now()
			for i := 0; i < 3 || !numbers; i++ {
				took, err := render()
				if err != nil {
					return err
				}
				if i == 0 {
					first = float64(took.Microseconds()) / 1000
				}
				if numbers = !strings.Contains(last.Body.String(), "data-counting"); numbers && line.UntilNumbersMs == 0 && page.path == "/" {
					line.UntilNumbersMs = float64(time.Since(began).Microseconds()) / 1000
				}
				if !numbers {
					if time.Since(began) > 5*time.Minute {
						return fmt.Errorf("%s: no numbers after 5 minutes", page.path)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			for range cfg.dashN {
				if page.path == "/" && cfg.dashEvery > 0 {
					time.Sleep(cfg.dashEvery) // an open page's refresh: the kept count comes due meanwhile
				}
				took, err := render()
				if err != nil {
					return err
				}
				times = append(times, float64(took.Microseconds())/1000)
				body := last.Body.String()
				if strings.Contains(body, "data-counting") {
					return fmt.Errorf("%s: a render after the numbers showed says counting again", page.path)
				}
				if strings.Contains(body, "data-kept") {
					line.Kept++
					if strings.Contains(body, "data-recounting") {
						line.Recounting++
					}
				}
				for _, m := range tookRE.FindAllStringSubmatch(body, -1) {
					ms, _ := strconv.ParseInt(m[1], 10, 64)
					line.CountMs = max(line.CountMs, ms)
				}
			}
			slices.Sort(times)
			line.Mode, line.DB, line.Case, line.Rows, line.Queued, line.Page = "dashboard", "postgres", name, cfg.dashRows, queued, page.name
			line.N, line.FirstMs, line.P50ms, line.P90ms, line.MaxMs = len(times), first, times[len(times)/2], times[len(times)*9/10], times[len(times)-1]
			line.Status, line.BodySize = last.Code, last.Body.Len()
			if err := out.Encode(line); err != nil {
				return err
			}
		}
		return nil
	}
	finished := cfg.dashRows - 10000
	if err := fill(finished); err != nil {
		return err
	}
	if err := measure("Schema's indexes", 10000); err != nil {
		return err
	}
	// The index the dashboard asks for without it (the chart by processed_at needs it).
	if _, err := pool.Exec(ctx, b.Dialect().(dialects.FinishedCounter).FinishedIndexStatement(tb)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+tb.Name); err != nil {
		return err
	}
	if err := measure("with an index on processed_at", 10000); err != nil {
		return err
	}
	if err := fill(0); err != nil {
		return err
	}
	return measure("every row queued", cfg.dashRows)
}
