package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
)

// Events of the service's own (sqlpart.CompileEvent): each is compiled at Open into ?
// placeholders, one per occurrence, and prepared against the live server like the
// dialect's own statements, so a typo or a missing column is refused at Subscribe. A
// settlement whose step names an event runs it in place of the built-in statement, where
// the form runs its settlements (see Settle, SettleLease, ExtendLeases).

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
			var me *mysql.MySQLError
			if f := classify(err); errors.As(err, &me) && f != dialects.FaultConnection && f != dialects.FaultContention {
				return nil, &dialects.ConfigError{Table: t.Name, Option: fmt.Sprintf("OnEvent(%q)", name),
					Reason: "the event's SQL does not prepare (" + ev.Text + ")", Err: err,
					Fix: "correct the statement; it runs on MySQL with the values named in braces"}
			}
			return nil, fmt.Errorf("mysql: prepare event %q on table %s: %w", name, t.Name, err)
		}
		events[name] = ev
	}
	return events, nil
}

// event returns the text and the arguments of step's event for row id.
func (q *queue) event(step dialects.Step, id int64) (string, []any, error) {
	ev, ok := q.events[step.Event]
	if !ok {
		return "", nil, fmt.Errorf("the subscription has no event %q", step.Event)
	}
	v := step.EventValues(id, q.group, q.settle.destGroup)
	args, err := ev.Args(&v, bindTime)
	if err != nil {
		return "", nil, err
	}
	return ev.Text, args, nil
}

// statement returns a row lock or advisory step's operation name and statement: its
// event's when the step names one (run like any statement, never a move), the built-in
// one otherwise (settleSQL.statement).
func (q *queue) statement(step dialects.Step, id int64) (op, text string, args []any, move bool, err error) {
	if step.Event != "" {
		text, args, err = q.event(step, id)
		return "event " + step.Event, text, args, false, err
	}
	text, args, move, err = q.settle.statement(step, id)
	return step.Kind.String(), text, args, move, err
}

// bindTime binds an event's time as the dialect binds every time (dbTime).
func bindTime(t time.Time) any { return dbTime(t) }

// confirmText locks a lease row if it holds the token: id, token.
func confirmText(t dialects.Table) string {
	return "SELECT 1 FROM " + quote(t.Name) + " WHERE " + quote(t.ID) + " = ? AND " + quote(t.LockedUntil) + " = ? FOR UPDATE"
}

// markText moves a lease row's token one microsecond on if it holds the token: until,
// id, token. unmarkText puts the token back: token, id. On a Galera node the confirm is
// these two writes: a locking read holds on the node alone and certification orders
// writes only, so an event that writes no queue row (a note elsewhere, the row left to its
// lease) confirmed by a read committed even after another node's claim took the row, on a
// node that had not applied that claim yet. The two writes change the row twice and leave
// it as it was; its key is in the event's write set, and certification fails whichever of
// the event and the other claim comes second.
func markText(t dialects.Table) string {
	return "UPDATE " + quote(t.Name) + " SET " + quote(t.LockedUntil) + " = ? WHERE " + quote(t.ID) + " = ? AND " +
		quote(t.LockedUntil) + " = ?"
}

func unmarkText(t dialects.Table) string {
	return "UPDATE " + quote(t.Name) + " SET " + quote(t.LockedUntil) + " = ? WHERE " + quote(t.ID) + " = ?"
}

// leaseEvent runs a lease delivery's event inside tx, after locking its row and
// confirming the token: false, with nothing run, when the row holds another token (or
// is gone). A confirmed event settles whatever its own row count.
func (q *leaseQueue) leaseEvent(ctx context.Context, tx *sql.Tx, step dialects.Step, held dialects.Lease) (bool, error) {
	text, args, err := q.event(step, held.ID)
	if err != nil {
		return false, err
	}
	if q.d.cluster {
		if ok, err := q.confirmByWrites(ctx, tx, held); err != nil || !ok {
			return false, err
		}
	} else {
		confirm, err := q.d.stmt(ctx, q.confirm)
		if err != nil {
			return false, err
		}
		var one int
		err = tx.StmtContext(ctx, confirm).QueryRowContext(ctx, held.ID, dbTime(held.Token)).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("confirm the lease: %w", err)
		}
	}
	s, err := q.d.stmt(ctx, text)
	if err == nil {
		_, err = tx.StmtContext(ctx, s).ExecContext(ctx, args...)
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// confirmByWrites confirms held's token on a Galera node (markText): false when the row
// holds another token or is gone.
func (q *leaseQueue) confirmByWrites(ctx context.Context, tx *sql.Tx, held dialects.Lease) (bool, error) {
	mark, err := q.d.stmt(ctx, q.mark)
	if err != nil {
		return false, err
	}
	token := dbTime(held.Token)
	n, err := affected(tx.StmtContext(ctx, mark).ExecContext(ctx, token.Add(time.Microsecond), held.ID, token))
	if err != nil {
		return false, fmt.Errorf("confirm the lease: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	unmark, err := q.d.stmt(ctx, q.unmark)
	if err != nil {
		return false, err
	}
	if _, err := tx.StmtContext(ctx, unmark).ExecContext(ctx, token, held.ID); err != nil {
		return false, fmt.Errorf("confirm the lease: %w", err)
	}
	return true, nil
}

// settleEvent runs a lease delivery's event in a READ COMMITTED transaction of its own,
// retried whole after a deadlock or a lock wait timeout, like the dead-letter move.
func (q *leaseQueue) settleEvent(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	ok, err := withRetry(ctx, func() (bool, error) {
		// inTx: an event waiting for a row another session holds, cut short, is killed
		// on the server (see SettleLease).
		var ok bool
		err := q.inTx(ctx, true, func(x *txn) error {
			var err error
			if ok, err = q.leaseEvent(ctx, x.tx, step, held); err == nil && !ok {
				return errUnchanged
			}
			return err
		})
		if errors.Is(err, errUnchanged) {
			return false, nil
		}
		return ok, err
	})
	if err != nil {
		return false, q.errorf("event "+step.Event, err)
	}
	return ok, nil
}

// extendEach runs the subscription's own extend event once per lease, in autocommit; a
// lease whose statement changed no row is lost. The server counts changed rows only (the
// DSN does not set clientFoundRows), which is right here: a kept lease moves from its
// token to until, a different value.
func (q *leaseQueue) extendEach(ctx context.Context, ev dialects.Event, until time.Time, held []dialects.Lease) ([]int64, error) {
	s, err := q.d.stmt(ctx, ev.Text)
	if err != nil {
		return nil, q.errorf("event extend", err)
	}
	var moved []int64
	for _, l := range held {
		v := dialects.EventValues{ID: l.ID, Held: l.Token, Until: until}
		args, err := ev.Args(&v, bindTime)
		if err != nil {
			return moved, q.errorf("event extend", err)
		}
		n, err := affected(s.ExecContext(ctx, args...))
		if err != nil {
			return moved, q.errorf("event extend", err)
		}
		if n > 0 {
			moved = append(moved, l.ID)
		}
	}
	return moved, nil
}
