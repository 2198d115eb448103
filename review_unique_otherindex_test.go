package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/rowactor/rowactor"
)

func init() {
	scenarios = append(scenarios, scenario{
		name:   "a unique publish that conflicts on another unique index of the table is that index's error",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withUniqueKey},
		run:    uniqueOtherIndexScenario,
	})
}

// uniqueOtherIndexScenario: the table has a unique index of the service's own besides the
// key's. A publish that breaks it is that index's error, not "held already" (the other
// row's id returned and the message lost) nor a failed lookup of the key. MariaDB's
// ON DUPLICATE KEY cannot name the key's index; it is open there (issue #18's note).
func uniqueOtherIndexScenario(t *testing.T, h *harness, _ rowactor.Form) {
	if h.drv.name == "mysql" {
		t.Skip("open on MariaDB: ON DUPLICATE KEY UPDATE fires on any unique index (issue #18)")
	}
	h.drv.exec(t, h.d, fmt.Sprintf("CREATE UNIQUE INDEX %s_payload ON %s (payload)", h.table.Name, h.table.Name))
	b := h.broker()
	ctx := context.Background()
	first, err := b.Publish(ctx, h.table, h.queue, []byte("same"), rowactor.Unique("k1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]rowactor.PublishOption{{rowactor.Unique("k2")}, nil} {
		id, err := b.Publish(ctx, h.table, h.queue, []byte("same"), opts...)
		if err == nil {
			t.Fatalf("a publish breaking the payload index returned id %d (the first row is %d): the message is lost", id, first)
		}
		if msg := err.Error(); !strings.Contains(msg, "duplicate key") && !strings.Contains(msg, "UNIQUE constraint failed") {
			t.Fatalf("a publish breaking the payload index: %v; want the index's own error", err)
		}
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 1 {
		t.Fatalf("%d rows, want the first one only", n)
	}
}
