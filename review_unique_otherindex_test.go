package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
			!strings.Contains(msg, "Duplicate entry") {
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

func init() {
	scenarios = append(scenarios, scenario{
		name:   "a unique publish of the key a row in work holds returns that row at once",
		shapes: []tableShape{withUniqueKey},
		run:    uniqueHeldKeyScenario,
	})
}

// uniqueHeldKeyScenario: a handler publishes the key its own row holds (a follow-up it
// means to deduplicate). The row lock form holds the row's lock all the while: the
// publish must not wait for it (on MariaDB, ON DUPLICATE KEY UPDATE did, up to
// innodb_lock_wait_timeout: the handler waited on itself).
func uniqueHeldKeyScenario(t *testing.T, h *harness, _ rowactor.Form) {
	b := h.broker()
	id := h.publishKey(b, "held")
	got := make(chan error, 1)
	h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		again, err := b.Publish(c, h.table, h.queue, []byte("again"), rowactor.Unique("held"))
		if err == nil && again != d.ID() {
			err = fmt.Errorf("the publish returned id %d, the row holding the key is %d", again, d.ID())
		}
		got <- err
		return rowactor.Ack()
	})
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("a publish of the key row %d holds, from its own handler: %v", id, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	h.waitSettled(1)
	if n := h.countKey("held"); n != 0 {
		t.Fatalf("%d rows hold the key after the ack", n)
	}
}
