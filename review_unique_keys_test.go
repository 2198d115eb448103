package rowactor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/rowactor/rowactor"
)

// TestReviewUniqueKeysCompareExactly: a unique key is a key: two keys that differ in case,
// accents or trailing spaces are two keys on every database, as PostgreSQL and SQLite
// compare them. Each publish of a new key inserts its own row and returns its own id; a
// publish that returned another key's holder would silently drop the message.
func TestReviewUniqueKeysCompareExactly(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
			b := h.broker()
			keys := []string{"order-a", "ORDER-A", "order-á", "order-a ", "order-ä"}
			ids := map[int64]string{}
			for _, k := range keys {
				id := h.publishKey(b, k)
				if prev, ok := ids[id]; ok {
					t.Errorf("Publish with Unique(%q) returned id %d, the row of key %q: the message was not written", k, id, prev)
					continue
				}
				ids[id] = k
			}
			if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != len(keys) {
				t.Fatalf("%d rows for %d distinct keys", n, len(keys))
			}
			// The held keys are still recognised, each as its own.
			for id, k := range ids {
				if again := h.publishKey(b, k); again != id {
					t.Errorf("Unique(%q) again returned %d, want its holder %d", k, again, id)
				}
			}
		})
	}
}

// TestReviewUniqueLongKey: a key longer than the column Schema renders is an error, never
// a truncated key that could collide with another.
func TestReviewUniqueLongKey(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
			b := h.broker()
			base := strings.Repeat("k", 300)
			id1, err1 := b.Publish(context.Background(), h.table, h.queue, []byte("1"), rowactor.Unique(base+"1"))
			id2, err2 := b.Publish(context.Background(), h.table, h.queue, []byte("2"), rowactor.Unique(base+"2"))
			t.Logf("long keys: %d %v / %d %v", id1, err1, id2, err2)
			if err1 == nil && err2 == nil && id1 == id2 {
				t.Fatalf("two different 301-character keys returned one id %d", id1)
			}
		})
	}
}

// TestReviewUniquePublishTxRolledBack: a unique publish in a transaction rolled back
// leaves the key free.
func TestReviewUniquePublishTxRolledBack(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, rowactor.FormLease, withUniqueKey)
			b := h.broker()
			tx, _, rollback := drv.begin(t, h.d)
			id1, err := b.PublishTx(context.Background(), tx, h.table, h.queue, []byte("1"), rowactor.Unique("rb"))
			if err != nil {
				t.Fatal(err)
			}
			id1b, err := b.PublishTx(context.Background(), tx, h.table, h.queue, []byte("1b"), rowactor.Unique("rb"))
			if err != nil || id1b != id1 {
				t.Fatalf("second publish in the same transaction: %d %v, want %d", id1b, err, id1)
			}
			if err := rollback(); err != nil {
				t.Fatal(err)
			}
			// (SQLite may hand the rolled-back id out again: ids of rows never committed
			// are free.)
			h.publishKey(b, "rb")
			if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)); n != 1 {
				t.Fatalf("%d rows after the rollback and one publish", n)
			}
			if n := h.countKey("rb"); n != 1 {
				t.Fatalf("%d rows hold the key", n)
			}
		})
	}
}
