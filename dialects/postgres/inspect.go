package postgres

import (
	"context"
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
	state, usesNow, err := statsState(t)
	if err != nil {
		return dialects.Job{}, err
	}
	args := []any{now}
	idParam := "$2"
	if !usesNow {
		args, idParam = nil, "$1"
	}
	rows, err := d.pool.Query(ctx, adminsql.InspectText(t, quote, state, idParam), append(args, id)...)
	if err != nil {
		return dialects.Job{}, adminErr("inspect", t.Name, err)
	}
	defer rows.Close()
	j, err := adminsql.ScanJob(rows, t, id, t.Form() != dialects.FormRowLock, func() (any, func() (time.Time, error)) {
		var v *time.Time
		return &v, func() (time.Time, error) {
			if v == nil {
				return time.Time{}, nil
			}
			return *v, nil
		}
	})
	if err != nil {
		return dialects.Job{}, adminErr("inspect", t.Name, err)
	}
	return j, nil
}
