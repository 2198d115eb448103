package postgres

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// Poison rows (see sqlpart.CountAttempt): the attempt counter stops at its column type's
// largest value, a row whose values do not scan is returned flagged beside the rows the
// same claim read, and the row lock form's claims pass over rows set aside in memory.

// attemptMax reads the attempt column's type from the catalog (domains resolved to their
// base type) and returns its largest value; checkColumns has refused other types.
func (d *Dialect) attemptMax(ctx context.Context, t dialects.Table) (int64, error) {
	if t.Attempt == "" {
		return tablecheck.MaxInteger, nil
	}
	cols, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return 0, err
	}
	for _, c := range cols {
		if c.name != t.Attempt {
			continue
		}
		switch c.typ {
		case "smallint":
			return tablecheck.MaxSmallint, nil
		case "integer":
			return tablecheck.MaxInteger, nil
		case "bigint":
			return tablecheck.MaxBigint, nil
		}
		return 0, fmt.Errorf("postgres: table %s: the attempt column %s is %s", t.Name, t.Attempt, c.typ)
	}
	return 0, fmt.Errorf("postgres: table %s has no attempt column %s", t.Name, t.Attempt)
}

// scanValues scans the current row as rows.Scan does, but decodes each value itself: pgx
// ends the whole result when one value does not scan, and the rows after it would be lost
// (in the lease form: leased, and never delivered).
func scanValues(rows pgx.Rows, dest ...any) error {
	fds, raw := rows.FieldDescriptions(), rows.RawValues()
	if len(fds) != len(dest) || len(raw) != len(dest) {
		return fmt.Errorf("%d columns for %d destinations", len(fds), len(dest))
	}
	m := rows.Conn().TypeMap()
	for i, d := range dest {
		if d == nil {
			continue
		}
		if err := m.Scan(fds[i].DataTypeOID, fds[i].Format, raw[i], d); err != nil {
			return pgx.ScanArgError{ColumnIndex: i, FieldName: fds[i].Name, Err: err}
		}
	}
	return nil
}

// unreadable names a claimed row whose values did not scan (scanErr): it reads the id
// alone (the first column) and returns the row flagged. A row whose id cannot be read
// cannot be named: its error fails the claim.
func (q *queue) unreadable(rows pgx.Rows, scanErr error) (dialects.Row, error) {
	var id int64
	dest := make([]any, len(rows.FieldDescriptions()))
	if len(dest) == 0 {
		return dialects.Row{}, &dialects.RowDataError{Table: q.name, Err: scanErr}
	}
	dest[0] = &id
	if err := scanValues(rows, dest...); err != nil {
		return dialects.Row{}, &dialects.RowDataError{Table: q.name, Err: scanErr}
	}
	return dialects.Row{ID: id, Fault: &dialects.RowDataError{Table: q.name, ID: id, Err: scanErr}}, nil
}

// skipSet holds the ids of rows set aside in memory.
type skipSet struct {
	mu  sync.Mutex
	ids []int64
}

func (s *skipSet) add(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.ids, id) {
		s.ids = append(s.ids, id)
	}
}

// list returns the ids, nil when there are none.
func (s *skipSet) list() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) == 0 {
		return nil
	}
	return slices.Clone(s.ids)
}

// skipCond writes the condition that passes over the ids set aside ($n bigint[]).
func skipCond(w *builder, t dialects.Table) string {
	return " AND NOT (" + quote(t.ID) + " = ANY(" + w.p(pSkip) + "::bigint[]))"
}

var (
	_ dialects.SkipQueue = (*rowLockQueue)(nil)
	_ dialects.SkipQueue = fifoRowLockQueue{}
)

// Skip makes the queue's later claims pass over row id, set aside in memory.
func (q *rowLockQueue) Skip(id int64) { q.skip.add(id) }
