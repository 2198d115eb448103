package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// Events of the service's own (sqlpart.CompileEvent): each is compiled at Open into ?
// placeholders, one per occurrence, and prepared against the file like the dialect's own
// statements, so a typo or a missing column is refused at Subscribe. A step naming an
// event runs it in place of the built-in statement, as a settlement (see
// leaseSettlement, advisorySettlement): on the pool in this process's writer turn, or
// inside a delivery's transaction. In the lease form the event runs only after its
// transaction confirmed the token (queue.confirmed, deliveryTx.run); the lease form's own
// extend event replaces ExtendLeases' statement.

// compileEvents compiles and prepares the subscription's events, in name order.
func (d *Dialect) compileEvents(ctx context.Context, spec dialects.QueueSpec) (map[string]dialects.Event, error) {
	if len(spec.Events) == 0 {
		return nil, nil
	}
	t := spec.Table
	question := func(int) string { return "?" }
	events := make(map[string]dialects.Event, len(spec.Events))
	for _, name := range slices.Sorted(maps.Keys(spec.Events)) {
		ev, err := sqlpart.CompileEvent(t.Name, name, spec.Events[name], t.Form(), question)
		if err != nil {
			return nil, err
		}
		if _, err := d.stmt(ctx, ev.Text); err != nil {
			// SQLite reports a syntax error, a missing table or column alike: SQLITE_ERROR.
			var se *sqlite.Error
			if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_ERROR {
				return nil, &dialects.ConfigError{Table: t.Name, Option: fmt.Sprintf("OnEvent(%q)", name),
					Reason: "the event's SQL does not prepare (" + ev.Text + ")", Err: err,
					Fix: "correct the statement; it runs on SQLite with the values named in braces"}
			}
			return nil, fmt.Errorf("sqlite: prepare event %q on table %s: %w", name, t.Name, err)
		}
		events[name] = ev
	}
	return events, nil
}

// bindTime binds an event's time as every time column is stored (TimeLayout text).
func bindTime(t time.Time) any { return formatTime(t) }

// eventSettlement is the settlement of a step naming an event: the event's statement for
// row id.
func (q *queue) eventSettlement(step dialects.Step, id int64) (settlement, error) {
	op := "event " + step.Event
	ev, ok := q.events[step.Event]
	if !ok {
		return settlement{}, q.errorf(op, fmt.Errorf("the subscription has no event %q", step.Event))
	}
	v := step.EventValues(id, q.group, q.settle.destGroup)
	args, err := ev.Args(&v, bindTime)
	if err != nil {
		return settlement{}, q.errorf(op, err)
	}
	return settlement{op: op, text: ev.Text, args: args}, nil
}

// confirmText confirms that a lease row holds a token: id, token. It is a write that
// changes nothing rather than a SELECT so that, inside a delivery's deferred transaction,
// it takes the write lock as the built-in settlement's UPDATE would (waiting in the busy
// handler) instead of opening a read whose later upgrade to a write fails at once with
// SQLITE_BUSY when another connection writes meanwhile. Its row count is the answer, and
// once it ran the transaction holds the write lock, so the row stays as confirmed until
// the commit.
func confirmText(t dialects.Table) string {
	lu := quote(t.LockedUntil)
	return "UPDATE " + quote(t.Name) + " SET " + lu + " = " + lu + " WHERE " + quote(t.ID) + " = ? AND " + lu + " = ?"
}

// leaseEvent is a lease delivery's event settlement, which confirms the token first.
func (q *leaseQueue) leaseEvent(step dialects.Step, held dialects.Lease) (settlement, error) {
	st, err := q.eventSettlement(step, held.ID)
	st.confirm, st.confirmArgs = q.confirm, []any{held.ID, formatTime(held.Token)}
	return st, err
}

// confirmed runs a lease-form event in a BEGIN IMMEDIATE transaction of its own, in this
// process's writer turn: it confirms the token, then runs the event and commits; false,
// with nothing run, when the row holds another token (or is gone). A confirmed event
// settles whatever its own row count.
func (q *queue) confirmed(ctx context.Context, st settlement) (bool, error) {
	return q.immediate(ctx, st.op, func(conn *sql.Conn) (bool, error) {
		n, err := changed(conn.ExecContext(ctx, st.confirm, st.confirmArgs...))
		if err != nil {
			return false, q.errorf(st.op+" confirm", err)
		}
		if n == 0 {
			return false, nil
		}
		if _, err := conn.ExecContext(ctx, st.text, st.args...); err != nil {
			return false, q.errorf(st.op, err)
		}
		return true, nil
	})
}

// extendEach runs the subscription's own extend event once per lease, all in one BEGIN
// IMMEDIATE transaction in this process's writer turn; a lease whose statement changed no
// row is lost. Nothing is moved when the transaction fails.
func (q *leaseQueue) extendEach(ctx context.Context, ev dialects.Event, until time.Time, held []dialects.Lease) ([]int64, error) {
	const op = "event extend"
	var moved []int64
	_, err := q.immediate(ctx, op, func(conn *sql.Conn) (bool, error) {
		for _, l := range held {
			v := dialects.EventValues{ID: l.ID, Held: l.Token, Until: until}
			args, err := ev.Args(&v, bindTime)
			if err != nil {
				return false, q.errorf(op, err)
			}
			n, err := changed(conn.ExecContext(ctx, ev.Text, args...))
			if err != nil {
				return false, q.errorf(op, err)
			}
			if n > 0 {
				moved = append(moved, l.ID)
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return moved, nil
}
