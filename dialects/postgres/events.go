package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// compileEvents turns the subscription's own events into $n statements and prepares each
// against the live database, so a typo or a missing column is refused at Subscribe.
func (d *Dialect) compileEvents(ctx context.Context, spec dialects.QueueSpec) (map[string]dialects.Event, error) {
	if len(spec.Events) == 0 {
		return nil, nil
	}
	dollar := func(n int) string { return "$" + strconv.Itoa(n) }
	events := make(map[string]dialects.Event, len(spec.Events))
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("postgres: prepare events on table %s: %w", spec.Table.Name, err)
	}
	defer conn.Release()
	for name, sql := range spec.Events {
		ev, err := sqlpart.CompileEvent(spec.Table.Name, name, sql, spec.Table.Form(), dollar)
		if err != nil {
			return nil, err
		}
		if _, err := conn.Conn().PgConn().Prepare(ctx, "", ev.Text, nil); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				return nil, &dialects.ConfigError{Table: spec.Table.Name, Option: fmt.Sprintf("OnEvent(%q)", name),
					Reason: "the event's SQL does not prepare (" + ev.Text + ")", Err: err,
					Fix: "correct the statement; it runs on PostgreSQL with the values named in braces"}
			}
			return nil, fmt.Errorf("postgres: prepare event %q on table %s: %w", name, spec.Table.Name, err)
		}
		events[name] = ev
	}
	return events, nil
}

// runEvent runs step's event for row id on db and returns how many rows it changed.
func (q *queue) runEvent(ctx context.Context, db querier, step dialects.Step, id int64) (int64, error) {
	ev, ok := q.events[step.Event]
	if !ok {
		return 0, q.errorf("event "+step.Event, fmt.Errorf("the subscription has no event %q", step.Event))
	}
	v := step.EventValues(id, q.group, q.dest)
	args, err := ev.Args(&v, nil)
	if err != nil {
		return 0, q.errorf("event "+step.Event, err)
	}
	tag, err := db.Exec(ctx, ev.Text, args...)
	if err != nil {
		return 0, q.errorf("event "+step.Event, err)
	}
	return tag.RowsAffected(), nil
}

// confirmText locks a lease row and confirms it holds the delivery's token.
func confirmText(t dialects.Table) string {
	return "SELECT 1 FROM " + quote(t.Name) + " WHERE " + quote(t.ID) + " = $1 AND " + quote(t.LockedUntil) + " = $2 FOR UPDATE"
}

// leaseEvent runs a lease delivery's event inside tx, after locking its row and
// confirming the token: false, with nothing run, when the row holds another token.
func (q *leaseQueue) leaseEvent(ctx context.Context, tx pgx.Tx, step dialects.Step, held dialects.Lease) (bool, error) {
	var one int
	if err := tx.QueryRow(ctx, q.confirm, held.ID, held.Token).Scan(&one); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return false, q.errorf("event "+step.Event+" confirm", err)
	}
	if _, err := q.runEvent(ctx, tx, step, held.ID); err != nil {
		return false, err
	}
	return true, nil
}

// settleEvent runs a lease delivery's event in a transaction of its own.
func (q *leaseQueue) settleEvent(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	tx, err := q.d.pool.BeginTx(ctx, q.txOptions)
	if err != nil {
		return false, q.errorf("event "+step.Event+" begin", err)
	}
	ok, err := q.leaseEvent(ctx, tx, step, held)
	if err != nil || !ok {
		if rerr := tx.Rollback(ctx); rerr != nil && err == nil {
			err = q.errorf("event "+step.Event+" rollback", rerr)
		}
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, q.errorf("event "+step.Event+" commit", err)
	}
	return true, nil
}

// extendEach runs the subscription's own extend event once per lease; a lease whose
// statement changed no row is lost.
func (q *leaseQueue) extendEach(ctx context.Context, ev dialects.Event, until time.Time, held []dialects.Lease) ([]int64, error) {
	var moved []int64
	for _, l := range held {
		v := dialects.EventValues{ID: l.ID, Held: l.Token, Until: until}
		args, err := ev.Args(&v, nil)
		if err != nil {
			return moved, q.errorf("event extend", err)
		}
		tag, err := q.d.pool.Exec(ctx, ev.Text, args...)
		if err != nil {
			return moved, q.errorf("event extend", err)
		}
		if tag.RowsAffected() > 0 {
			moved = append(moved, l.ID)
		}
	}
	return moved, nil
}
