package adminsql

import (
	"fmt"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// inspectColumns are the optional columns Inspect reads after the state, in this order.
func inspectColumns(t dialects.Table) []string {
	var cols []string
	for _, c := range []string{t.Group, t.Attempt, t.Payload, t.Headers, t.RetryAfter, t.LockedUntil, t.ProcessedAt, t.DeadAt, t.Error} {
		if c != "" {
			cols = append(cols, c)
		}
	}
	return cols
}

// listColumns are the optional columns ListJobs reads after the state, in this order:
// inspectColumns less the payload and the headers, which a list does not show.
func listColumns(t dialects.Table) []string {
	var cols []string
	for _, c := range []string{t.Group, t.Attempt, t.RetryAfter, t.LockedUntil, t.ProcessedAt, t.DeadAt, t.Error} {
		if c != "" {
			cols = append(cols, c)
		}
	}
	return cols
}

// InspectText is the statement Inspect runs: state (the dialect's Stats CASE), then the
// described columns, of the row whose id is bound at idParam.
func InspectText(t dialects.Table, quote func(string) string, state, idParam string) string {
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
func ScanJob(rows dialects.Rows, t dialects.Table, id int64, inWorkCounted bool, scanTime TimeScan) (dialects.Job, error) {
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return dialects.Job{}, err
		}
		return dialects.Job{}, fmt.Errorf("row %d: %w", id, dialects.ErrRowNotFound)
	}
	j := dialects.Job{ID: id, InWorkCounted: inWorkCounted}
	if err := scanJob(rows, t, &j, nil, scanTime, true); err != nil {
		return dialects.Job{}, err
	}
	return j, rows.Err()
}

// scanJob scans the current row into j: first into lead (the columns before the state,
// such as a listed row's id), then the state and inspectColumns (whole, a row Inspect
// reads) or listColumns.
func scanJob(rows dialects.Rows, t dialects.Table, j *dialects.Job, lead []any, scanTime TimeScan, whole bool) error {
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
	if whole {
		add(t.Payload, &j.Payload)
		add(t.Headers, &j.Headers)
	}
	for _, c := range []struct {
		col string
		at  *time.Time
	}{{t.RetryAfter, &j.RetryAfter}, {t.LockedUntil, &j.LockedUntil}, {t.ProcessedAt, &j.ProcessedAt}, {t.DeadAt, &j.DeadAt}} {
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
	j.State = dialects.JobState(state)
	if t.Group != "" {
		if group != nil {
			j.Group = *group
		} else {
			j.NullGroup = true
		}
	}
	if attempt != nil {
		j.Attempt = dialects.AttemptsMade(t.Form(), *attempt, j.State == dialects.JobProcessed || j.State == dialects.JobCancelled || j.State == dialects.JobDead)
	}
	if errText != nil {
		j.Error = *errText
	}
	return nil
}
