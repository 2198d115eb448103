package rowactor_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
)

// TestReviewPrioOutOfRange: a priority the column cannot hold is an error, never a
// different priority stored in its place; one it can hold is stored as given.
func TestReviewPrioOutOfRange(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withPriority)
			b := h.broker()
			for _, p := range []int{math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, math.MinInt32 - 1, math.MaxInt64, math.MinInt64} {
				id, err := b.Publish(context.Background(), h.table, h.queue, []byte("x"), rowactor.Priority(p))
				if err != nil {
					// The refusal names the column, its range and the fix, before
					// anything is written.
					if !strings.Contains(err.Error(), "does not fit the priority column") || !strings.Contains(err.Error(), "widen the column") {
						t.Errorf("Priority(%d): %v; want the column's range and the fix", p, err)
					}
					continue
				}
				if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = ? AND priority = ?", h.table.Name), id, p); n != 1 {
					t.Errorf("Priority(%d) returned no error, and row %d does not hold that priority", p, id)
				}
			}
			if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE priority IN (?, ?)", h.table.Name), math.MaxInt32, math.MinInt32); n != 2 {
				t.Errorf("%d rows hold the int32 bounds, want 2 (both fit every database's column)", n)
			}
		})
	}
}

// TestReviewPrioOutOfRangeMySQLLoose: on a MySQL session without strict mode the server
// stores an out-of-range value clamped, with a warning: the publish must still not
// report success for a priority it did not store.
func TestReviewPrioOutOfRangeMySQLLoose(t *testing.T) {
	drv := driverNamed(t, "mysql")
	h := newHarness(t, drv, rowactor.FormLease, withPriority)
	d, err := mysql.Open(context.Background(), mysqlDSN()+"&sql_mode=%27NO_ENGINE_SUBSTITUTION%27")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	b := h.brokerOn(d)
	p := math.MaxInt32 + 10
	id, err := b.Publish(context.Background(), h.table, h.queue, []byte("x"), rowactor.Priority(p))
	if err != nil {
		t.Logf("Priority(%d): %v", p, err)
		return
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s WHERE id = ? AND priority = ?", h.table.Name), id, p); n != 1 {
		t.Fatalf("Priority(%d) returned no error, and row %d does not hold that priority", p, id)
	}
}

// TestReviewUniqueLongKeyMySQLLoose: on a MySQL session without strict mode the server
// stores a value longer than its column cut, with a warning: two long keys that share
// the column's length would become one key, and the second publish would return the
// first's row and write nothing.
func TestReviewUniqueLongKeyMySQLLoose(t *testing.T) {
	drv := driverNamed(t, "mysql")
	h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
	d, err := mysql.Open(context.Background(), mysqlDSN()+"&sql_mode=%27NO_ENGINE_SUBSTITUTION%27")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	b := h.brokerOn(d)
	base := strings.Repeat("k", 1000)
	id1, err1 := b.Publish(context.Background(), h.table, h.queue, []byte("1"), rowactor.Unique(base+"1"))
	id2, err2 := b.Publish(context.Background(), h.table, h.queue, []byte("2"), rowactor.Unique(base+"2"))
	t.Logf("%d %v / %d %v", id1, err1, id2, err2)
	if err1 == nil && err2 == nil && id1 == id2 {
		t.Fatalf("two different 1,001-byte keys returned one id %d: the second message was not written", id1)
	}
}
