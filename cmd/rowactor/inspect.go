package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/rowactor/rowactor"
)

var inspectCommand = &command{
	name:    "inspect",
	summary: "show one row of a queue table and where it stands",
	help: `Usage: rowactor inspect [-dsn URL] [-json] [column flags] TABLE ID

Reads row ID of the table, in one statement that writes nothing, and prints its state
(the first of these that holds, as stats counts rows) and the columns the flags name:
  processed   processed_at is set
  in work     a lease not yet expired (lease form), or an advisory key a session holds
              (PostgreSQL and MySQL). The row lock form, and SQLite's advisory keys, cannot
              tell: a row in work reads as due, and the output says so
  dead        dead_at is set: a dead letter, waiting for a requeue (DEAD AT tells when
              it died; without -dead-at a dead letter reads as due or delayed)
  delayed     retry_after is in the future
  due         claimable now
The payload is printed as text when it is valid UTF-8, else as its length. -json prints
one JSON object instead, with null for what the table does not keep. A row the table does
not hold is an error (exit status 1).

Examples:
  rowactor inspect -dsn sqlite:jobs.db -group queue -attempt attempt -retry-after retry_after \
      -locked-until locked_until -error error jobs 42
  DATABASE_URL=postgres://app@db/app rowactor inspect -json -group queue jobs 42 | jq .state
`,
}

func init() { inspectCommand.run = runInspect }

func runInspect(ctx context.Context, e *env, args []string) error {
	fs := newFlags(inspectCommand)
	dsnValue := dsnFlag(fs)
	asJSON := fs.Bool("json", false, "print one JSON object")
	var t rowactor.Table
	addTableFlags(fs, &t)
	b, id, closeDB, err := openRow(ctx, e, inspectCommand, fs, args, dsnValue, &t)
	if err != nil {
		return err
	}
	defer closeDB()
	j, err := b.Inspect(ctx, t, id)
	if err != nil {
		return err
	}
	l := newInspectLine(t, j)
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(l)
	}
	return printInspect(e.stdout, l)
}

// inspectLine is one row as printed; nil is what the table does not keep.
type inspectLine struct {
	Table string `json:"table"`
	ID    int64  `json:"id"`
	State string `json:"state"`
	// InWorkCounted is false where the database cannot tell a row in work.
	InWorkCounted bool    `json:"in_work_counted"`
	Group         *string `json:"group"`
	NullGroup     bool    `json:"null_group,omitempty"`
	Attempt       *int64  `json:"attempt"`
	// Payload is the payload as text when it is valid UTF-8; PayloadBytes is its length.
	Payload      *string    `json:"payload"`
	PayloadBytes int        `json:"payload_bytes"`
	Headers      *string    `json:"headers"`
	RetryAfter   *time.Time `json:"retry_after"`
	LockedUntil  *time.Time `json:"locked_until"`
	ProcessedAt  *time.Time `json:"processed_at"`
	DeadAt       *time.Time `json:"dead_at"`
	Error        *string    `json:"error"`
}

func newInspectLine(t rowactor.Table, j rowactor.Job) inspectLine {
	l := inspectLine{Table: t.Name, ID: j.ID, State: j.State.String(), InWorkCounted: j.InWorkCounted,
		NullGroup: j.NullGroup, PayloadBytes: len(j.Payload)}
	if t.Group != "" && !j.NullGroup {
		l.Group = &j.Group
	}
	if t.Attempt != "" {
		l.Attempt = &j.Attempt
	}
	if utf8.Valid(j.Payload) {
		p := string(j.Payload)
		l.Payload = &p
	}
	if t.Headers != "" && j.Headers != nil {
		h := string(j.Headers)
		l.Headers = &h
	}
	for _, c := range []struct {
		col string
		at  time.Time
		to  **time.Time
	}{{t.RetryAfter, j.RetryAfter, &l.RetryAfter}, {t.LockedUntil, j.LockedUntil, &l.LockedUntil}, {t.ProcessedAt, j.ProcessedAt, &l.ProcessedAt},
		{t.DeadAt, j.DeadAt, &l.DeadAt}} {
		if c.col != "" && !c.at.IsZero() {
			at := c.at.UTC()
			*c.to = &at
		}
	}
	if t.Error != "" && j.Error != "" {
		l.Error = &j.Error
	}
	return l
}

// printInspect prints one field a line.
func printInspect(w io.Writer, l inspectLine) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	state := l.State
	if !l.InWorkCounted && l.State == "due" {
		state += " (or in work: the database cannot tell)"
	}
	fmt.Fprintf(tw, "TABLE\t%s\nID\t%d\nSTATE\t%s\n", l.Table, l.ID, state)
	switch {
	case l.NullGroup:
		fmt.Fprintln(tw, "GROUP\tNULL")
	case l.Group != nil:
		fmt.Fprintf(tw, "GROUP\t%q\n", *l.Group)
	}
	if l.Attempt != nil {
		fmt.Fprintf(tw, "ATTEMPT\t%d\n", *l.Attempt)
	}
	if l.Payload != nil {
		fmt.Fprintf(tw, "PAYLOAD\t%q\n", *l.Payload)
	} else {
		fmt.Fprintf(tw, "PAYLOAD\t%d bytes, not text\n", l.PayloadBytes)
	}
	if l.Headers != nil {
		fmt.Fprintf(tw, "HEADERS\t%s\n", *l.Headers)
	}
	for _, f := range []struct {
		name string
		at   *time.Time
	}{{"RETRY AFTER", l.RetryAfter}, {"LOCKED UNTIL", l.LockedUntil}, {"PROCESSED AT", l.ProcessedAt}, {"DEAD AT", l.DeadAt}} {
		if f.at != nil {
			fmt.Fprintf(tw, "%s\t%s\n", f.name, f.at.Format(time.RFC3339Nano))
		}
	}
	if l.Error != nil {
		fmt.Fprintf(tw, "ERROR\t%s\n", *l.Error)
	}
	return tw.Flush()
}
