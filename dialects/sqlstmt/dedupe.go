package sqlstmt

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Dedupe is the outbox's dedupe store on a database/sql dialect: one insert that adds a
// record id, or changes nothing when the id is there already (the dialect's own
// insert-or-ignore), run in the caller's *sql.Tx.
type Dedupe struct {
	DB     string // the dialect's name, for errors
	Table  string
	Insert string // binds the id, then (Stamp) the time
	Stamp  bool
	// Time renders a time as the dialect binds it.
	Time func(time.Time) any
}

// Once inserts id in the caller's transaction and reports whether it was new.
func (s *Dedupe) Once(ctx context.Context, tx any, id int64, now time.Time) (bool, error) {
	x, ok := tx.(*sql.Tx)
	if !ok || x == nil {
		return false, fmt.Errorf("%s: dedupe on table %s needs a *sql.Tx, got %T", s.DB, s.Table, tx)
	}
	args := []any{id}
	if s.Stamp {
		args = append(args, s.Time(now))
	}
	res, err := x.ExecContext(ctx, s.Insert, args...)
	if err != nil {
		return false, fmt.Errorf("%s: dedupe on table %s: %w", s.DB, s.Table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("%s: dedupe on table %s: %w", s.DB, s.Table, err)
	}
	return n == 1, nil
}

// Close has nothing to release: the insert lives in the dialect's statement cache.
func (s *Dedupe) Close() error { return nil }
