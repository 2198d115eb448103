package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

var _ dialects.Inspector = (*Dialect)(nil)

// Inspect reads one row and its state as Stats would count it, in one statement. An
// advisory row in work reads as due: the keys live in the consuming process.
func (d *Dialect) Inspect(ctx context.Context, t dialects.Table, id int64, now time.Time) (dialects.Job, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return dialects.Job{}, err
	}
	state, usesNow := statsState(t)
	args := []any{sql.Named("id", id)}
	if usesNow {
		args = append(args, sql.Named("now", formatTime(now)))
	}
	rows, err := d.db.QueryContext(ctx, adminsql.InspectText(t, quote, state, ":id"), args...)
	if err != nil {
		return dialects.Job{}, adminErr("inspect", t.Name, err)
	}
	defer rows.Close()
	j, err := adminsql.ScanJob(rows, t, id, t.Form() == dialects.FormLease, func() (any, func() (time.Time, error)) {
		var v sql.NullString
		return &v, func() (time.Time, error) { return parseTime(v) }
	})
	if err != nil {
		return dialects.Job{}, adminErr("inspect", t.Name, err)
	}
	return j, nil
}
