package sqlite

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// TestConformance runs the dialects' shared suite on SQLite, a database file per test.
func TestConformance(t *testing.T) {
	dialecttest.Run(t, &harness{SQLRunner: sqlRunner})
}

func dbOf(d dialects.Dialect) *sql.DB { return d.(*Dialect).DB() }

// harness gives the suite a database file per test: every dialect a test opens shares it.
type harness struct {
	dialecttest.SQLRunner
	files sync.Map // *testing.T -> path
	seq   atomic.Int64
}

func (*harness) Caps() dialecttest.Caps {
	return dialecttest.SQLCaps(dialecttest.Caps{
		Types:        dialecttest.Types{CaseBlindText: "TEXT COLLATE NOCASE", ID: "INTEGER PRIMARY KEY", Text: "TEXT", Time: "TEXT", Int: "INTEGER", Blob: "BLOB", JSON: "TEXT"},
		AttemptTypes: []dialecttest.AttemptType{{Name: "capped", Max: attemptCap}},
		Concat:       concat,
		NowText:      formatTime,
		ListChunk:    maxSettle,
		SingleWriter: true,
		// Every lease queue and session can lend a transaction.
		TxAlways: true,
	})
}

func (*harness) Zero() dialects.Dialect { return &Dialect{} }

func (h *harness) Open(t *testing.T) dialects.Dialect {
	t.Helper()
	path, loaded := h.files.LoadOrStore(t, filepath.Join(t.TempDir(), "queue.db"))
	if !loaded {
		t.Cleanup(func() { h.files.Delete(t) })
	}
	return openFile(t, path.(string))
}

func (h *harness) TableName(t *testing.T, d dialects.Dialect, prefix string) string {
	return fmt.Sprintf("%s_%d", prefix, h.seq.Add(1))
}

func (*harness) Quote(ident string) string { return quote(ident) }

func (*harness) TimeArg(t time.Time) any { return formatTime(t) }

// State reads the row, and fails unless every time is stored as text in TimeLayout exactly
// (claims compare the text).
func (*harness) State(t *testing.T, d dialects.Dialect, tbl dialects.Table, id int64) (dialecttest.RowState, bool) {
	t.Helper()
	return dialecttest.ReadState(t, d.(*Dialect).DB(), quote, tbl, id, func(n sql.NullString) *time.Time {
		if !n.Valid {
			return nil
		}
		tm, err := time.Parse(TimeLayout, n.String)
		if err != nil || formatTime(tm) != n.String {
			t.Errorf("row %d: time %q is not stored in TimeLayout: %v", id, n.String, err)
			return nil
		}
		return &tm
	})
}

func (h *harness) Begin(t *testing.T, d dialects.Dialect) dialecttest.Tx {
	t.Helper()
	return h.BeginTx(t, d, nil)
}

// BatchText is the text of the batched statement for n leases (padded to a slot).
func (*harness) BatchText(q dialects.Queue, kind dialects.StepKind, n int) string {
	slot, _ := pairSlot(n)
	return q.(*leaseQueue).batch.release.text(slot)
}

// BatchTexts: batches of 1 to 15 leases pad to 5 sizes.
func (*harness) BatchTexts() int { return 5 }

// CheckPublished: the payload is stored as a BLOB, the headers as JSON text.
func (*harness) CheckPublished(t *testing.T, d dialects.Dialect, tbl dialects.Table, id int64) {
	t.Helper()
	var ptype, htype string
	var a int
	if err := d.(*Dialect).DB().QueryRowContext(ctx, "SELECT typeof(payload), typeof(headers), headers ->> '$.a' FROM "+
		quote(tbl.Name)+" WHERE id = ?", id).Scan(&ptype, &htype, &a); err != nil {
		t.Fatal(err)
	}
	if ptype != "blob" || htype != "text" || a != 1 {
		t.Errorf("stored payload as %s, headers as %s (a = %d)", ptype, htype, a)
	}
}

// SetAttemptType is never called: SQLite's integers are 64-bit, the counter capped.
func (*harness) SetAttemptType(t *testing.T, d dialects.Dialect, tbl dialects.Table, typ string) {
	t.Fatalf("SQLite keeps its attempt column as Schema renders it (asked for %s)", typ)
}

func concat(parts ...string) string { return strings.Join(parts, " || ") }

func (*harness) ConnsInUse(t *testing.T, d dialects.Dialect) int {
	return d.(*Dialect).DB().Stats().InUse
}
