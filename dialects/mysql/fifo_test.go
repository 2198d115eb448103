package mysql

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// The row lock form refuses SERIALIZABLE, where the guard's plain count would wait.
func TestFIFORowLockRefusesSerializable(t *testing.T) {
	d := newDialect(t)
	tbl := rowLockTable(tableName(t, d, "fifo"))
	tbl.FIFO, tbl.Isolation = true, dialects.Serializable
	createTable(t, d, tbl)
	_, err := d.Open(ctx, dialects.QueueSpec{Table: tbl, Group: "g"})
	if ce := dialecttest.ConfigError(t, err); ce.Option != "Table.Isolation" {
		t.Errorf("refusal names %q", ce.Option)
	}
	lt := leaseTable(tableName(t, d, "fifo"))
	lt.FIFO, lt.Isolation = true, dialects.Serializable
	createTable(t, d, lt)
	// The lease form claims at read committed: served.
	dialecttest.NewFIFOClaimer(t, dialecttest.OpenQueue(t, d, dialects.QueueSpec{Table: lt, Group: "g"}), lt)
	tbl.Isolation = dialects.RepeatableRead
	dialecttest.NewFIFOClaimer(t, dialecttest.OpenQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g"}), tbl)
}
