package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// A transactional handler whose transaction the database ended on its own (a deadlock's
// victim on MySQL/MariaDB and PostgreSQL, an interrupted write on SQLite) and that goes
// on writing through its Tx, then returns Ack: nothing of that delivery commits, its
// settlement reports an error wrapping dialects.ErrTxEnded, and the row comes back by its
// form's rule and is delivered again, whose Ack commits. In the end the ledger holds the
// second delivery's debit and credit, and nothing of the first.

// ledgerDDL creates the ledger (id, v) the handlers write to, in each database's quoting
// (so that the drivers drop it after the test), with row 2 in it.
func ledgerDDL(drv, name string) []string {
	switch drv {
	case "mysql":
		q := "`" + name + "`"
		return []string{"CREATE TABLE " + q + " (id BIGINT PRIMARY KEY, v VARCHAR(20) NOT NULL) ENGINE=InnoDB",
			"CREATE TABLE `" + name + "_heavy` (id INT PRIMARY KEY) ENGINE=InnoDB",
			"INSERT INTO " + q + " VALUES (2, 'before')"}
	case "postgres":
		q := `"` + name + `"`
		return []string{"CREATE TABLE IF NOT EXISTS " + q + " (id bigint PRIMARY KEY, v text NOT NULL)",
			"INSERT INTO " + q + " VALUES (2, 'before')"}
	}
	return []string{"CREATE TABLE " + name + " (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
		"INSERT INTO " + name + " VALUES (2, 'before')"}
}

// endTx has the database end tx, a handler's lent transaction that wrote ledger row
// debit: a deadlock with another session (which holds row 2 and waits for the debit, as
// the handler asks for row 2), or on SQLite an interrupted write.
func endTx(ctx context.Context, h *harness, tx any, ledger string, debit int64) error {
	switch h.drv.name {
	case "mysql":
		db := mysqlDB(h.d)
		other, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer other.Rollback()
		var conn int64
		if err := other.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&conn); err != nil {
			return err
		}
		// Heavier than the handler's transaction, so InnoDB picks the handler's as victim.
		if _, err := other.ExecContext(ctx, "INSERT INTO `"+ledger+"_heavy` VALUES "+
			strings.TrimSuffix(strings.Repeat("(?),", 300), ","), seq(300)...); err != nil {
			return err
		}
		if _, err := other.ExecContext(ctx, "SELECT id FROM `"+ledger+"` WHERE id = 2 FOR UPDATE"); err != nil {
			return err
		}
		waited := make(chan error, 1)
		go func() {
			_, err := other.ExecContext(ctx, "UPDATE `"+ledger+"` SET v = 'other' WHERE id = ?", debit)
			waited <- err
		}()
		if err := until(func() (bool, error) {
			var n int
			err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO LIKE 'UPDATE%'", conn).Scan(&n)
			return n > 0, err
		}); err != nil {
			return err
		}
		_, err = tx.(*sql.Tx).ExecContext(ctx, "UPDATE `"+ledger+"` SET v = 'handler' WHERE id = 2")
		if werr := <-waited; werr != nil {
			return fmt.Errorf("the other session was the victim: %w", werr)
		}
		if err == nil || !strings.Contains(err.Error(), "1213") {
			return fmt.Errorf("want the handler's write deadlocked, got %v", err)
		}
		return nil
	case "postgres":
		ptx := tx.(*sql.Tx)
		// The handler's backend looks for the deadlock first, and aborts itself.
		if _, err := ptx.ExecContext(ctx, "SET LOCAL deadlock_timeout = '50ms'"); err != nil {
			return err
		}
		other, err := pgPool(h.d).Begin(ctx)
		if err != nil {
			return err
		}
		defer other.Rollback(context.Background())
		var pid int
		if err := other.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		if _, err := other.Exec(ctx, "SET LOCAL deadlock_timeout = '60s'"); err != nil {
			return err
		}
		if _, err := other.Exec(ctx, `UPDATE "`+ledger+`" SET v = 'other' WHERE id = 2`); err != nil {
			return err
		}
		waited := make(chan error, 1)
		go func() {
			_, err := other.Exec(ctx, `INSERT INTO "`+ledger+`" VALUES ($1, 'other')`, debit)
			waited <- err
		}()
		if err := until(func() (bool, error) {
			var n int
			err := pgPool(h.d).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", pid).Scan(&n)
			return n > 0, err
		}); err != nil {
			return err
		}
		_, err = ptx.ExecContext(ctx, `UPDATE "`+ledger+`" SET v = 'handler' WHERE id = 2`)
		if werr := <-waited; werr != nil {
			return fmt.Errorf("the other session was the victim: %w", werr)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			return fmt.Errorf("want the handler's write deadlocked, got %v", err)
		}
		return nil
	}
	// SQLite: a write interrupted by its context's end rolls the whole transaction back.
	c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := tx.(*sql.Tx).ExecContext(c, "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000000) "+
		"INSERT INTO "+ledger+" (id, v) SELECT x + 1000, 'bulk' FROM n")
	if err == nil {
		return errors.New("the bulk write was not interrupted")
	}
	return nil
}

func seq(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// until polls cond every 5 ms for up to 10 s.
func until(cond func() (bool, error)) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestTxEndedByTheDatabase(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			t.Run(drv.name+"/"+fmt.Sprint(form), func(t *testing.T) {
				h := newHarness(t, drv, form)
				ledger := h.table.Name + "_ledger"
				for _, s := range ledgerDDL(drv.name, ledger) {
					h.exec(s)
				}
				b := h.broker()
				var (
					calls  atomic.Int64
					mu     sync.Mutex
					failed []string
				)
				fail := func(format string, args ...any) {
					mu.Lock()
					failed = append(failed, fmt.Sprintf(format, args...))
					mu.Unlock()
				}
				h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
					n := calls.Add(1)
					if err := h.drv.txExec(ctx, d.Tx(), "INSERT INTO "+ledger+" (id, v) VALUES (?, 'debit')", 100+n); err != nil {
						fail("delivery %d: debit: %v", n, err)
						return rowactor.Ack()
					}
					if n == 1 {
						if err := endTx(ctx, h, d.Tx(), ledger, 100+n); err != nil {
							fail("end the transaction: %v", err)
						}
					}
					// After the end, the credit must not commit on its own (it may fail).
					err := h.drv.txExec(ctx, d.Tx(), "INSERT INTO "+ledger+" (id, v) VALUES (?, 'credit')", 200+n)
					if err != nil && n > 1 {
						fail("delivery %d: credit: %v", n, err)
					}
					return rowactor.Ack()
				}, append(leaseOptions(form, time.Second), rowactor.Transactional(), rowactor.Workers(1))...)
				id := h.publish(b, 1)[0]
				got := h.waitSettled(2)
				mu.Lock()
				for _, f := range failed {
					t.Error(f)
				}
				mu.Unlock()
				var ended, acked int
				for _, st := range got {
					switch {
					case errors.Is(st.Err, dialects.ErrTxEnded):
						ended++
					case st.Err == nil && st.Step == "ack":
						acked++
					default:
						t.Errorf("settlement %+v", st)
					}
				}
				if ended != 1 || acked != 1 {
					t.Fatalf("settlements %+v: want one reporting dialects.ErrTxEnded and one ack", got)
				}
				for _, c := range []struct {
					id   int64
					want int
				}{{101, 0}, {201, 0}, {102, 1}, {202, 1}} {
					if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = ?", ledger), c.id); n != c.want {
						t.Errorf("ledger row %d: %d committed, want %d", c.id, n, c.want)
					}
				}
				if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = 2 AND v = 'before'", ledger)); n != 1 {
					t.Error("ledger row 2 changed")
				}
				if h.row(id).exists {
					t.Error("the queue row is still there after the second delivery's ack")
				}
			})
		}
	}
}
