package mysql

import (
	"context"
	"database/sql"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

var _ dialects.Inspector = (*Dialect)(nil)

// Inspect reads one row and its state as Stats would count it, in one statement.
func (d *Dialect) Inspect(ctx context.Context, t dialects.Table, id int64, now time.Time) (dialects.Job, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return dialects.Job{}, err
	}
	state, nows, err := statsState(t)
	if err != nil {
		return dialects.Job{}, err
	}
	args := make([]any, nows, nows+1)
	for i := range args {
		args[i] = dbTime(now)
	}
	rows, err := d.db.QueryContext(ctx, adminsql.InspectText(t, quote, state, "?"), append(args, id)...)
	if err != nil {
		return dialects.Job{}, adminErr("inspect", t.Name, err)
	}
	defer rows.Close()
	j, err := adminsql.ScanJob(rows, t, id, t.Form() != dialects.FormRowLock, func() (any, func() (time.Time, error)) {
		var v sql.NullTime
		return &v, func() (time.Time, error) { return v.Time, nil }
	})
	if err != nil {
		return dialects.Job{}, adminErr("inspect", t.Name, err)
	}
	return j, nil
}
