package dialects

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrRowNotFound reports a row id the table does not hold.
var ErrRowNotFound = errors.New("rowactor: no row with that id")

// Inspector is a dialect that tells what became of one row (cmd/rowactor inspect,
// Broker.Inspect). Like Admin's methods it first checks the description against the live
// table and refuses a mismatch with a *ConfigError.
type Inspector interface {
	// Inspect reads row id of t as of now, in one statement that writes nothing; it
	// returns an error wrapping ErrRowNotFound when the table holds no such row.
	Inspect(ctx context.Context, t Table, id int64, now time.Time) (Job, error)
}

// JobState is where a row stands, as Stats counts it: each row is in the first of
// processed, in work, delayed and due that holds.
type JobState int

const (
	// JobProcessed: processed_at is set.
	JobProcessed JobState = iota
	// JobInWork: a delivery holds the row (a lease not yet expired, or an advisory key a
	// session holds); see Job.InWorkCounted.
	JobInWork
	// JobDelayed: retry_after is in the future.
	JobDelayed
	// JobDue: claimable now (or in work where the database cannot tell).
	JobDue
)

func (s JobState) String() string {
	switch s {
	case JobProcessed:
		return "processed"
	case JobInWork:
		return "in work"
	case JobDelayed:
		return "delayed"
	case JobDue:
		return "due"
	}
	return "unknown"
}

// Job is one row as Inspect read it. A column the description does not name reads as
// its zero value, as does a NULL.
type Job struct {
	ID int64
	// Group is the row's group; NullGroup says it is NULL (no subscription claims it).
	Group     string
	NullGroup bool
	State     JobState
	// InWorkCounted says the database can tell a row in work: false in the row lock form
	// and for SQLite's advisory keys, where a row in work reads as due (as in Stats).
	InWorkCounted bool
	// Attempt is the attempt column as stored: 1 when published, counted on by each
	// claim in the lease and advisory forms and by each retry in the row lock form.
	Attempt     int64
	Payload     []byte
	Headers     []byte
	RetryAfter  time.Time
	LockedUntil time.Time
	ProcessedAt time.Time
	// Error is the error column: the last failure's text, kept until an ack clears it.
	Error string
}

// inspectColumns are the optional columns Inspect reads after the state, in this order.
func inspectColumns(t Table) []string {
	var cols []string
	for _, c := range []string{t.Group, t.Attempt, t.Payload, t.Headers, t.RetryAfter, t.LockedUntil, t.ProcessedAt, t.Error} {
		if c != "" {
			cols = append(cols, c)
		}
	}
	return cols
}

// InspectText is the statement Inspect runs: state (the dialect's Stats CASE), then the
// described columns, of the row whose id is bound at idParam.
func InspectText(t Table, quote func(string) string, state, idParam string) string {
	var b strings.Builder
	b.WriteString("SELECT " + state)
	for _, c := range inspectColumns(t) {
		b.WriteString(", " + quote(c))
	}
	b.WriteString(" FROM " + quote(t.Name) + " WHERE " + quote(t.ID) + " = " + idParam)
	return b.String()
}

// TimeScan is a dialect's way to read a nullable time column: dest to scan into, and get
// to read the time once scanned (zero for NULL).
type TimeScan func() (dest any, get func() (time.Time, error))

// ScanJob reads InspectText's row into a Job of id; an error wrapping ErrRowNotFound when
// the query returned no row.
func ScanJob(rows Rows, t Table, id int64, inWorkCounted bool, scanTime TimeScan) (Job, error) {
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return Job{}, err
		}
		return Job{}, fmt.Errorf("row %d: %w", id, ErrRowNotFound)
	}
	j := Job{ID: id, InWorkCounted: inWorkCounted}
	if err := scanJob(rows, t, &j, nil, scanTime); err != nil {
		return Job{}, err
	}
	return j, rows.Err()
}

// scanJob scans the current row into j: first into lead (the columns before the state,
// such as a listed row's id), then the state and inspectColumns.
func scanJob(rows Rows, t Table, j *Job, lead []any, scanTime TimeScan) error {
	var (
		state   int64
		group   *string
		attempt *int64
		errText *string
		times   []func() (time.Time, error)
		into    []*time.Time
	)
	dest := append(lead, &state)
	add := func(col string, d any) {
		if col != "" {
			dest = append(dest, d)
		}
	}
	add(t.Group, &group)
	add(t.Attempt, &attempt)
	add(t.Payload, &j.Payload)
	add(t.Headers, &j.Headers)
	for _, c := range []struct {
		col string
		at  *time.Time
	}{{t.RetryAfter, &j.RetryAfter}, {t.LockedUntil, &j.LockedUntil}, {t.ProcessedAt, &j.ProcessedAt}} {
		if c.col != "" {
			d, get := scanTime()
			dest = append(dest, d)
			times, into = append(times, get), append(into, c.at)
		}
	}
	add(t.Error, &errText)
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	for i, get := range times {
		v, err := get()
		if err != nil {
			return err
		}
		*into[i] = v
	}
	j.State = JobState(state)
	if t.Group != "" {
		if group != nil {
			j.Group = *group
		} else {
			j.NullGroup = true
		}
	}
	if attempt != nil {
		j.Attempt = *attempt
	}
	if errText != nil {
		j.Error = *errText
	}
	return nil
}
