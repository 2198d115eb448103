package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/headers"
	"github.com/rowactor/rowactor/internal/telemetry"
)

var statsCommand = &command{
	name:    "stats",
	summary: "count a queue table's rows by group: due, delayed, dead, in work, processed, cancelled",
	help: `Usage: rowactor stats [-dsn URL] [-json] [column flags] TABLE

Counts the table's rows, one line per group (one line for a table without groups). Each
row is counted once, in the first of:
  CANCELLED   processed_at is set and the error starts with "cancelled: ": the outcome
              Cancel or Broker.Cancel ended it (n/a without -processed-at and -error)
  PROCESSED   processed_at is set (n/a without -processed-at)
  IN WORK     a delivery holds it: a lease not yet expired (lease form), or an advisory
              key held by a session (advisory form, PostgreSQL and MySQL; rows waiting
              behind the held key count too). n/a where the database cannot tell: the row
              lock form, and SQLite's advisory keys, which live in the consuming process;
              rows in work then count as due
  DEAD        dead_at is set: a dead letter, waiting for a requeue, whatever its
              retry_after (n/a without -dead-at; without it dead letters count as
              due or delayed)
  DELAYED     retry_after is in the future (n/a without -retry-after)
  DUE         the rest: claimable now
OLDEST DUE is how long the due row the next claim takes (the lowest id) has waited: since
the latest of its retry_after, its expired lease and its publish time (the
rowactor-published-at header that Publish writes); "unknown" when the table keeps none.
With -error, each group's most frequent errors follow, leaving out the reasons of
cancelled rows: a cancellation is no failure.

It reads the whole table in one statement and writes nothing. -json prints one JSON
object per line instead, with null for what the table cannot tell.

Examples:
  rowactor stats -dsn sqlite:jobs.db -group queue -attempt attempt -retry-after retry_after \
      -processed-at processed_at -locked-until locked_until -dead-at dead_at -headers headers jobs
  DATABASE_URL=postgres://app@db/app rowactor stats -group queue jobs
  rowactor stats -dsn 'mysql://app:secret@tcp(db:3306)/app' -json -group queue jobs | jq .
`,
}

func init() { statsCommand.run = runStats }

func runStats(ctx context.Context, e *env, args []string) error {
	fs := newFlags(statsCommand)
	dsnValue := dsnFlag(fs)
	asJSON := fs.Bool("json", false, "print one JSON object per group and line")
	var t rowactor.Table
	addTableFlags(fs, &t)
	rest, err := parse(e, statsCommand, fs, args)
	if err != nil {
		return err
	}
	if err := tableArg(rest, &t); err != nil {
		return err
	}
	dsn, err := resolveDSN(e, *dsnValue)
	if err != nil {
		return err
	}
	admin, closeDB, err := openAdmin(ctx, dsn)
	if err != nil {
		return err
	}
	defer closeDB()
	now := time.Now()
	groups, err := admin.Stats(ctx, t, now)
	if err != nil {
		return err
	}
	lines := make([]statsLine, len(groups))
	for i, g := range groups {
		lines[i] = newStatsLine(t, g, now)
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		for _, l := range lines {
			if err := enc.Encode(l); err != nil {
				return err
			}
		}
		return nil
	}
	return printStats(e.stdout, t, lines)
}

// statsLine is one group's counts as printed; nil is what the table cannot tell.
type statsLine struct {
	Table string `json:"table"`
	// Group is nil for a table without groups, and for the rows whose group is NULL
	// (NullGroup), which no subscription claims.
	Group     *string `json:"group"`
	NullGroup bool    `json:"null_group,omitempty"`
	Due       int64   `json:"due"`
	Delayed   *int64  `json:"delayed"`
	// Dead counts the dead letters (dead_at set); nil without -dead-at.
	Dead      *int64 `json:"dead"`
	InWork    *int64 `json:"in_work"`
	Processed *int64 `json:"processed"`
	// Cancelled counts the rows a cancellation ended and kept, apart from Processed; nil
	// without -processed-at and -error.
	Cancelled *int64 `json:"cancelled"`
	// OldestDueID is the due row the next claim takes; nil when none is due.
	OldestDueID *int64 `json:"oldest_due_id"`
	// OldestDueAge is how long it has waited, in seconds; nil when unknown.
	OldestDueAge *float64 `json:"oldest_due_age_seconds"`
	// Errors are the group's most frequent errors among its rows that hold one (tables
	// with an error column, -error).
	Errors []errorLine `json:"errors,omitempty"`
}

// errorLine is one error text (its first 200 characters) and how many rows hold it.
type errorLine struct {
	Error string `json:"error"`
	Rows  int64  `json:"rows"`
}

func newStatsLine(t rowactor.Table, g dialects.GroupStats, now time.Time) statsLine {
	l := statsLine{Table: t.Name, Due: g.Due}
	if t.Group != "" && !g.NullGroup {
		l.Group = &g.Group
	}
	l.NullGroup = g.NullGroup
	for _, e := range g.Errors {
		l.Errors = append(l.Errors, errorLine{Error: e.Error, Rows: e.Rows})
	}
	if t.RetryAfter != "" {
		l.Delayed = &g.Delayed
	}
	if t.DeadAt != "" {
		l.Dead = &g.Dead
	}
	if g.InWorkCounted {
		l.InWork = &g.InWork
	}
	if t.ProcessedAt != "" {
		l.Processed = &g.Processed
		if t.Error != "" {
			l.Cancelled = &g.Cancelled
		}
	}
	if g.Oldest.ID != 0 {
		l.OldestDueID = &g.Oldest.ID
		if since := dueSince(g.Oldest); !since.IsZero() {
			age := max(now.Sub(since), 0).Seconds()
			l.OldestDueAge = &age
		}
	}
	return l
}

// dueSince is when a due row became due as far as it tells: the latest of its
// retry_after, its expired lease and its publish time; zero when it keeps none.
func dueSince(r dialects.DueRow) time.Time {
	since := r.RetryAfter
	if r.LockedUntil.After(since) {
		since = r.LockedUntil
	}
	h, _ := headers.Decode(r.Headers) // a malformed column: what can be read of it
	if p, err := time.Parse(time.RFC3339Nano, h[telemetry.PublishedAtHeader]); err == nil && p.After(since) {
		since = p
	}
	return since
}

// printStats prints the lines as a table.
func printStats(w io.Writer, t rowactor.Table, lines []statsLine) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if t.Group != "" {
		fmt.Fprint(tw, "GROUP\t")
	}
	fmt.Fprintln(tw, "DUE\tDELAYED\tDEAD\tIN WORK\tPROCESSED\tCANCELLED\tOLDEST DUE")
	for _, l := range lines {
		switch {
		case l.NullGroup:
			fmt.Fprint(tw, "NULL\t")
		case l.Group != nil && *l.Group == "":
			fmt.Fprint(tw, "''\t")
		case l.Group != nil:
			fmt.Fprint(tw, *l.Group+"\t")
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Due, count(l.Delayed), count(l.Dead), count(l.InWork), count(l.Processed), count(l.Cancelled), oldest(l))
	}
	if len(lines) == 0 {
		fmt.Fprintln(tw, "(no rows)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printErrors(w, t, lines)
}

// printErrors lists each group's most frequent errors, when some row holds one.
func printErrors(w io.Writer, t rowactor.Table, lines []statsLine) error {
	some := false
	for _, l := range lines {
		some = some || len(l.Errors) > 0
	}
	if !some {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if t.Group != "" {
		fmt.Fprint(tw, "GROUP\t")
	}
	fmt.Fprintln(tw, "ROWS\tMOST FREQUENT ERRORS")
	for _, l := range lines {
		for _, e := range l.Errors {
			if t.Group != "" {
				fmt.Fprint(tw, groupName(l)+"\t")
			}
			fmt.Fprintf(tw, "%d\t%s\n", e.Rows, oneLine(e.Error))
		}
	}
	return tw.Flush()
}

// groupName prints a line's group as the table does.
func groupName(l statsLine) string {
	switch {
	case l.NullGroup:
		return "NULL"
	case l.Group != nil && *l.Group == "":
		return "''"
	case l.Group != nil:
		return *l.Group
	}
	return ""
}

// oneLine keeps an error on its line: line breaks and tabs read as spaces, and a text
// longer than 120 characters is cut with an ellipsis.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 120 {
		s = string(r[:119]) + "…"
	}
	return s
}

func count(n *int64) string {
	if n == nil {
		return "n/a"
	}
	return strconv.FormatInt(*n, 10)
}

func oldest(l statsLine) string {
	switch {
	case l.OldestDueID == nil:
		return "-"
	case l.OldestDueAge == nil:
		return fmt.Sprintf("unknown (id %d)", *l.OldestDueID)
	}
	return fmt.Sprintf("%s (id %d)", age(time.Duration(*l.OldestDueAge*float64(time.Second))), *l.OldestDueID)
}

// age prints a wait to a useful precision: tenths of a second under a minute, seconds
// under a day, minutes beyond.
func age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < 24*time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
