package postgres

import (
	"context"
	"strconv"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

var _ dialects.DueProber = (*Dialect)(nil)

// DueQueues asks about every group in one statement: one EXISTS per group, each an index
// probe of the claim's own condition, numbered by the group's place.
func (d *Dialect) DueQueues(ctx context.Context, t dialects.Table, lease bool, groups []string, now time.Time) ([]bool, error) {
	return sqlpart.ProbeGroups(groups, func(chunk []string) ([]bool, error) {
		text, args := probeSQL(t, lease, chunk, now)
		rows, err := d.pool.Query(ctx, text, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		return sqlpart.ReadDue(rows, t, len(chunk))
	})
}

// probeSQL renders the probe of groups: "SELECT i WHERE EXISTS (a claimable row of group
// i)" for each, joined by UNION ALL. The claim's condition without its group is numbered
// first (now), then one parameter per group.
func probeSQL(t dialects.Table, lease bool, groups []string, now time.Time) (string, []any) {
	var w builder
	rest := t
	rest.Group = ""
	cond := claimable(&w, rest, "", lease)
	args := stmt{params: w.params}.args(&bind{now: now})
	var q builder
	for i, g := range groups {
		if i > 0 {
			q.w(" UNION ALL ")
		}
		q.w("SELECT ", strconv.Itoa(i), " WHERE EXISTS (SELECT 1 FROM ", quote(t.Name), " WHERE ")
		if t.Group != "" {
			args = append(args, g)
			q.w(quote(t.Group), " = $", strconv.Itoa(len(args)), " AND ")
		}
		q.w(cond, ")")
		if t.Group == "" {
			break // one question: the table's rows (ReadDue answers for every entry)
		}
	}
	return q.b.String(), args
}
