package mysql

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

var _ dialects.DueProber = (*Dialect)(nil)

// DueQueues asks about every group in one statement: one EXISTS per group, each an index
// probe of the claim's own condition, numbered by the group's place. The statement is
// prepared once per chunk size (sqlpart.ProbeChunk).
func (d *Dialect) DueQueues(ctx context.Context, t dialects.Table, lease bool, groups []string, now time.Time) ([]bool, error) {
	return sqlpart.ProbeGroups(groups, func(chunk []string) ([]bool, error) {
		text, args := probeSQL(t, lease, chunk, now)
		st, err := d.stmts.Stmt(ctx, text)
		if err != nil {
			return nil, err
		}
		rows, err := st.QueryContext(ctx, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		return sqlpart.ReadDue(rows, t, len(chunk))
	})
}

// probeSQL renders the probe of groups: "SELECT i FROM DUAL WHERE EXISTS (a claimable row
// of group i)" for each, joined by UNION ALL.
func probeSQL(t dialects.Table, lease bool, groups []string, now time.Time) (string, []any) {
	rest := t
	rest.Group = ""
	cl := newClaimable(rest, lease)
	var b strings.Builder
	var args []any
	for i, g := range groups {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT " + strconv.Itoa(i) + " FROM DUAL WHERE EXISTS (SELECT 1 FROM " + quote(t.Name) + " WHERE ")
		if t.Group != "" {
			b.WriteString(quote(t.Group) + " = ? AND ")
			args = append(args, g)
		}
		b.WriteString(cl.where + ")")
		args = cl.args(args, "", now)
		if t.Group == "" {
			break // one question: the table's rows (ReadDue answers for every entry)
		}
	}
	return b.String(), args
}
