package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// SQLite ends a transaction by itself after some errors: an interrupted write
// (sqlite3_interrupt, which the driver calls when a statement's context ends), or
// SQLITE_FULL, SQLITE_IOERR or SQLITE_NOMEM where the statement cannot be undone alone.
// The connection is then in autocommit, and the *sql.Tx does not know: a handler that goes
// on writing through it must not commit anything, and the settlement must report an error
// wrapping dialects.ErrTxEnded rather than commit. The suite's txended topic runs the
// lease and advisory forms through each ending.

// TxEndings are the ways SQLite ends a handler's transaction.
func (*harness) TxEndings() []dialecttest.TxEnding {
	var out []dialecttest.TxEnding
	for _, e := range endings {
		out = append(out, dialecttest.TxEnding{Name: e.name, End: func(t *testing.T, _ dialects.Dialect, lent any, ledger string) {
			t.Helper()
			tx, ok := lent.(*sql.Tx)
			if !ok || tx == nil {
				t.Fatalf("the lent transaction is a %T", lent)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+quote(ledger)+" (id, v) VALUES (1, 'debit')"); err != nil {
				t.Fatal(err)
			}
			e.end(t, tx, ledger)
			_, _ = tx.ExecContext(ctx, "INSERT INTO "+quote(ledger)+" (id, v) VALUES (3, 'credit')")
		}})
	}
	return out
}

// endings are the ways a handler's transaction is ended by SQLite, each run through tx;
// the rows they write have ids above 3.
var endings = []struct {
	name string
	end  func(t *testing.T, tx *sql.Tx, ledger string)
}{
	{"interrupted write", func(t *testing.T, tx *sql.Tx, ledger string) {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := tx.ExecContext(c, "WITH RECURSIVE n(x) AS (SELECT 10 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000000) "+
			"INSERT INTO "+quote(ledger)+" (id, v) SELECT x, 'bulk' FROM n")
		// The driver reports the context's error; SQLite reported SQLITE_INTERRUPT.
		if !errors.Is(err, context.DeadlineExceeded) && (err == nil || !strings.Contains(err.Error(), "interrupt")) {
			t.Fatalf("want the bulk write interrupted, got %v", err)
		}
	}},
	{"disk full", func(t *testing.T, tx *sql.Tx, ledger string) {
		var pages int64
		if err := tx.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "PRAGMA max_page_count = "+strconv.FormatInt(pages, 10)); err != nil {
			t.Fatal(err)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+quote(ledger)+" (id, v) VALUES (4, ?)", strings.Repeat("x", 1<<20))
		if err == nil || !strings.Contains(err.Error(), "full") {
			t.Fatalf("want SQLITE_FULL, got %v", err)
		}
	}},
}
