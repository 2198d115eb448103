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
// ON DUPLICATE KEY cannot name the key's index: the publish finds the conflict by the
// insert id its update leaves.
func uniqueOtherIndexScenario(t *testing.T, h *harness, _ rowactor.Form) {
	col := "payload"
	if h.drv.name == "mysql" {
		col = "payload(20)" // a BLOB's index needs a prefix
	}
	h.drv.exec(t, h.d, fmt.Sprintf("CREATE UNIQUE INDEX %s_payload ON %s (%s)", h.table.Name, h.table.Name, col))
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
		if msg := err.Error(); !strings.Contains(msg, "duplicate key") && !strings.Contains(msg, "UNIQUE constraint failed") &&
			!strings.Contains(msg, "other than the unique key") {
			t.Fatalf("a publish breaking the payload index: %v; want the index's own error", err)
		}
	}
	// A row without a key, and a publish without a key breaking the other index with it.
	if _, err := b.Publish(ctx, h.table, h.queue, []byte("keyless")); err != nil {
		t.Fatal(err)
	}
	if id, err := b.Publish(ctx, h.table, h.queue, []byte("keyless")); err == nil {
		t.Fatalf("a keyless publish breaking the payload index returned id %d: the message is lost", id)
	}
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 2 {
		t.Fatalf("%d rows, want the first two only", n)
	}
}
