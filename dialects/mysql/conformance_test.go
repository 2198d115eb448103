package mysql

import (
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// TestConformance runs the dialects' shared suite on MySQL/MariaDB.
func TestConformance(t *testing.T) { dialecttest.Run(t, harness{dialecttest.SQLRunner{DB: dbOf}}) }

func dbOf(d dialects.Dialect) *sql.DB { return d.(*Dialect).DB() }

// harness gives the suite the test server.
type harness struct{ dialecttest.SQLRunner }

func (harness) Caps() dialecttest.Caps {
	return dialecttest.SQLCaps(dialecttest.Caps{
		Types: dialecttest.Types{ID: "BIGINT AUTO_INCREMENT PRIMARY KEY", Text: "TEXT", Time: "DATETIME(6) NULL", Int: "SMALLINT", Blob: "LONGBLOB", JSON: "JSON"},
		AttemptTypes: []dialecttest.AttemptType{{Name: "SMALLINT", Type: "SMALLINT", Max: 32767}, {Name: "TINYINT UNSIGNED", Type: "TINYINT UNSIGNED", Max: 255},
			{Name: "INT", Type: "INT", Max: 2147483647}, {Name: "MEDIUMINT", Type: "MEDIUMINT", Max: 8388607}, {Name: "BIGINT", Type: "BIGINT", Max: 9223372036854775807}},
		Concat: concat,
		// Commit with no transaction open is a no-op.
		CommitWithoutTxSucceeds: true,
		TxNilAfterEnd:           true,
		RowLock:                 true,
		ListChunk:               maxList,
		ParkNudge:               time.Microsecond,
		WaiterKeepsPlace:        true,
		// Racing guards may all see each other's row locks.
		FIFORacingClaimsMayAllMiss: true,
	})
}

func (harness) Open(t *testing.T) dialects.Dialect { return newDialect(t) }

func (harness) Zero() dialects.Dialect { return &Dialect{} }

func (harness) TableName(t *testing.T, d dialects.Dialect, prefix string) string {
	return tableName(t, d.(*Dialect), prefix)
}

func (harness) Quote(ident string) string { return quote(ident) }

func (harness) TimeArg(t time.Time) any { return dbTime(t) }

// State reads the row, and fails unless every time reads back in UTC (the DSN's loc).
func (harness) State(t *testing.T, d dialects.Dialect, tbl dialects.Table, id int64) (dialecttest.RowState, bool) {
	t.Helper()
	s, ok := stateOf(t, d.(*Dialect), tbl, id)
	for _, tm := range []*time.Time{s.LockedUntil, s.RetryAfter, s.ProcessedAt} {
		if tm != nil && tm.Location() != time.UTC {
			t.Errorf("row %d: time %v read back outside UTC", id, tm)
		}
	}
	return dialecttest.RowState(s), ok
}

func (h harness) Begin(t *testing.T, d dialects.Dialect) dialecttest.Tx {
	t.Helper()
	return h.BeginTx(t, d, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// HoldFIFOGroup locks a row of the group that is not its head: the guard counts the
// group's rows in work with a locking read, which skips nothing.
func (harness) HoldFIFOGroup(t *testing.T, d dialects.Dialect, tbl dialects.Table, group string, behind int64) func() {
	t.Helper()
	tx, err := d.(*Dialect).DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRowContext(ctx, "SELECT id FROM "+quote(tbl.Name)+" WHERE id = ? FOR UPDATE", behind).Scan(&id); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	return func() { tx.Rollback() }
}

// BatchText is the text of the batched statement for n leases (padded to a slot).
func (harness) BatchText(q dialects.Queue, kind dialects.StepKind, n int) string {
	slot, _ := pairSlotOf(n)
	return q.(*leaseQueue).batch.lock.text(slot)
}

// BatchTexts: batches of 1 to 15 leases pad to 4 sizes.
func (harness) BatchTexts() int { return 4 }

// CheckPublished: the headers are stored as JSON the server can query.
func (harness) CheckPublished(t *testing.T, d dialects.Dialect, tbl dialects.Table, id int64) {
	t.Helper()
	if n := count(t, d.(*Dialect).DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)+
		" WHERE id = ? AND JSON_EXTRACT(headers, '$.traceparent') = '00-x' AND JSON_EXTRACT(headers, '$.a') = 1", id); n != 1 {
		t.Error("headers not stored as JSON")
	}
}

// HoldKey takes key's GET_LOCK on a connection of its own.
func (harness) HoldKey(t *testing.T, d dialects.Dialect, key string) func() {
	t.Helper()
	db := d.(*Dialect).DB()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", LockName(databaseName(t, db), key)).Scan(&got); err != nil || got != 1 {
		conn.Close()
		t.Fatalf("GET_LOCK: %v %v", got, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			// Release before closing: the server ends a closed connection's locks
			// asynchronously.
			conn.ExecContext(ctx, "SELECT RELEASE_ALL_LOCKS()")
			discard(conn)
		})
	}
}

func (harness) LocksHeld(t *testing.T, d dialects.Dialect, keys ...string) int {
	t.Helper()
	db := d.(*Dialect).DB()
	n := 0
	for _, key := range keys {
		if usedBy(t, db, LockName(databaseName(t, db), key)) != 0 {
			n++
		}
	}
	return n
}

// SetAttemptType: MODIFY the column, keeping its NOT NULL DEFAULT 1.
func (harness) SetAttemptType(t *testing.T, d dialects.Dialect, tbl dialects.Table, typ string) {
	t.Helper()
	narrowAttempt(t, d.(*Dialect), tbl, typ)
}

func concat(parts ...string) string { return "CONCAT(" + strings.Join(parts, ", ") + ")" }

func (harness) ConnsInUse(t *testing.T, d dialects.Dialect) int {
	return d.(*Dialect).DB().Stats().InUse
}
