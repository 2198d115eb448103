package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// Poison rows (see sqlpart.CountAttempt): the attempt counter stops at its column type's
// largest value, a row whose values do not scan is returned flagged beside the rows the
// same claim read, and the row lock form's claims pass over rows set aside in memory.

// attemptMax reads the attempt column's type from the catalog and returns its largest
// value. A column of a type that is not an integer (rowactor's statements still count on
// it) stops at a 32-bit integer's largest value.
func (d *Dialect) attemptMax(ctx context.Context, t dialects.Table) (int64, error) {
	if t.Attempt == "" {
		return tablecheck.MaxInteger, nil
	}
	var dataType, columnType string
	err := d.db.QueryRowContext(ctx, "SELECT DATA_TYPE, COLUMN_TYPE FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?", t.Name, t.Attempt).Scan(&dataType, &columnType)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("mysql: table %s has no attempt column %s", t.Name, t.Attempt)
	}
	if err != nil {
		return 0, fmt.Errorf("mysql: read the attempt column's type of table %s: %w", t.Name, err)
	}
	return integerMax(dataType, strings.Contains(strings.ToLower(columnType), "unsigned")), nil
}

// integerMax is the largest value of an integer column type (an unsigned BIGINT's is cut
// to what an int64 holds); other types get a 32-bit integer's.
func integerMax(dataType string, unsigned bool) int64 {
	maxima := map[string][2]int64{
		"tinyint":   {127, 255},
		"smallint":  {32767, 65535},
		"mediumint": {8388607, 16777215},
		"int":       {2147483647, 4294967295},
		"integer":   {2147483647, 4294967295},
		"bigint":    {tablecheck.MaxBigint, tablecheck.MaxBigint},
	}
	m, ok := maxima[strings.ToLower(dataType)]
	if !ok {
		return tablecheck.MaxInteger
	}
	if unsigned {
		return m[1]
	}
	return m[0]
}

// scanOne reads the single row of a claim's result (sql.ErrNoRows when there is none), as
// QueryRow would, except that a row whose values do not scan is returned flagged.
func (q *queue) scanOne(rows *sql.Rows, err error) (dialects.Row, error) {
	r, _, err := q.scanOneAttempt(rows, err)
	return r, err
}

// scanOneAttempt is scanOne also keeping the attempt column as read (scanRowAttempt).
func (q *queue) scanOneAttempt(rows *sql.Rows, err error) (dialects.Row, any, error) {
	if err != nil {
		return dialects.Row{}, nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return dialects.Row{}, nil, err
		}
		return dialects.Row{}, nil, sql.ErrNoRows
	}
	r, read, err := q.scanRowAttempt(rows)
	if err != nil {
		return dialects.Row{}, nil, err
	}
	if err := rows.Close(); err != nil {
		return dialects.Row{}, nil, err
	}
	return r, read, nil
}

// rawAttempt reads the current row's attempt column (the third) as the driver gives it,
// for a row whose values did not scan (database/sql converts them again on each Scan):
// nil when even that fails.
func (q *queue) rawAttempt(rows *sql.Rows) any {
	cols, err := rows.Columns()
	if err != nil || len(cols) < 3 {
		return nil
	}
	var raw any
	dest := make([]any, len(cols))
	for i := range dest {
		dest[i] = new(any)
	}
	dest[2] = &raw
	if rows.Scan(dest...) != nil {
		return nil
	}
	return raw
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

// list returns the ids as FIND_IN_SET's comma-separated list, "" when there are none.
func (s *skipSet) list() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for i, id := range s.ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	return b.String()
}

// skipCond is the condition that passes over the ids set aside (one ? binding their list).
func skipCond(t dialects.Table) string {
	return " AND FIND_IN_SET(" + quote(t.ID) + ", ?) = 0"
}

var (
	_ dialects.SkipQueue = (*rowLockQueue)(nil)
	_ dialects.SkipQueue = fifoRowLockQueue{}
)

// Skip makes the queue's later claims pass over row id, set aside in memory.
func (q *rowLockQueue) Skip(id int64) { q.skip.add(id) }

// Skip passes over a row set aside in memory: the group's head, it holds its group.
func (f fifoRowLockQueue) Skip(id int64) { f.q.Skip(id) }

// counts says whether the advisory take's count changes an attempt as read (the value
// scanRowAttempt kept): CountAttempt adds one below the cap and leaves NULL, and a value
// at the cap or beyond, as it is. MySQL reports a row an UPDATE leaves as it was as not
// changed, matched or not (unless the DSN sets clientFoundRows), so a count of a row
// at the cap could not tell the take whether the row was still claimable: the take
// decides from the read instead. A value it cannot read as a number is left to the count.
func (q *queue) counts(read any) bool {
	switch v := read.(type) {
	case nil:
		return false
	case int64:
		return v < q.attemptMax
	case uint64:
		return v < uint64(q.attemptMax)
	case []byte:
		return countsText(string(v), q.attemptMax)
	case string:
		return countsText(v, q.attemptMax)
	}
	return true
}

func countsText(v string, max int64) bool {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return n < max
	}
	if _, err := strconv.ParseUint(v, 10, 64); err == nil {
		return false // beyond an int64, so beyond every cap
	}
	return true
}
