package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// nullablePriorityTable creates h's table as Schema renders it, but with a nullable
// priority column, as a hand-written table (or one the column was added to) may have it.
func nullablePriorityTable(t *testing.T, h *harness) {
	t.Helper()
	switch h.drv.name {
	case "postgres":
		h.exec(fmt.Sprintf("ALTER TABLE %s ALTER COLUMN priority DROP NOT NULL", h.table.Name))
	case "mysql":
		h.exec(fmt.Sprintf("ALTER TABLE %s MODIFY priority INT NULL DEFAULT 0", h.table.Name))
	case "sqlite":
		// No ALTER COLUMN: make the table again.
		h.exec("DROP TABLE " + h.table.Name)
		ddl, err := rowactor.Schema(h.d, h.table)
		if err != nil {
			t.Fatal(err)
		}
		ddl = strings.Replace(ddl, "INTEGER NOT NULL DEFAULT 0", "INTEGER", 1)
		for _, stmt := range strings.Split(ddl, ";\n") {
			if strings.TrimSpace(stmt) != "" {
				h.exec(stmt)
			}
		}
	default:
		t.Fatalf("no nullable priority DDL for %s", h.drv.name)
	}
}

// TestReviewPrioNullPriority: a row whose priority is NULL (a hand-written table's
// nullable column, a row another program inserted) is a row like any other: every form
// on every database delivers it, never sets it aside as unreadable or dead-letters it.
// (The SQLite lease claim read each row's priority into an int64 to hand the rows out in
// order, and moved a NULL one to the dead letter as unreadable.)
func TestReviewPrioNullPriority(t *testing.T) {
	for _, drv := range drivers {
		for _, form := range drv.forms {
			t.Run(fmt.Sprintf("%s/%s", drv.name, form), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, drv, form, withPriority)
				nullablePriorityTable(t, h)
				// ids 1..4 in insert order
				for _, p := range []string{"5", "NULL", "0", "-3"} {
					h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, priority) VALUES (?, ?, %s)", h.table.Name, p), []byte("p"+p), h.queue)
				}
				b := h.broker()
				var mu sync.Mutex
				var order []string
				h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
					mu.Lock()
					order = append(order, string(d.Payload()))
					mu.Unlock()
					return rowactor.Ack()
				}, append([]rowactor.SubscribeOption{rowactor.Workers(1), rowactor.MaxAttempts(3), rowactor.DeadLetterGroup("dead")}, leaseOptions(form, 5*time.Second)...)...)
				got := h.waitSettled(4)
				for _, s := range got {
					if s.Err != nil || s.Step != "ack" {
						t.Errorf("settlement %+v", s)
					}
				}
				mu.Lock()
				defer mu.Unlock()
				t.Logf("order %v", order)
				if len(order) != 4 {
					t.Fatalf("handled %v, want the four rows\nlogs:\n%s", order, h.logs.String())
				}
				// The rows with a priority keep their order around the NULL one, which sorts
				// as the database sorts NULLs (PostgreSQL last, MySQL and SQLite first).
				var ranked []string
				for _, p := range order {
					if p != "pNULL" {
						ranked = append(ranked, p)
					}
				}
				if want := "[p-3 p0 p5]"; fmt.Sprint(ranked) != want {
					t.Errorf("claim order %v, want %s around the NULL row", order, want)
				}
			})
		}
	}
}
