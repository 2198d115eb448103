package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A unique publish inside a caller's REPEATABLE READ transaction whose snapshot predates
// the key's row, while a row lock claim holds that row: the publish must return the
// holder's id without waiting for the claim (as a publish through the pool does).
func TestUniquePublishTxInAnOlderSnapshotReturnsAClaimedHolderAtOnce(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "rajc_u", func(name string) dialects.Table {
		tb := rowLockTable(name)
		tb.UniqueKey = "ukey"
		return tb
	})
	caller, err := d.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer caller.Rollback()
	var n int
	if err := caller.QueryRowContext(ctx, "SELECT count(*) FROM "+quote(tbl.Name)).Scan(&n); err != nil { // the snapshot
		t.Fatal(err)
	}
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Group: "g", Payload: []byte("first"), UniqueKey: "k"})
	q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})
	c, ok, err := q.ClaimLocked(ctx, t0)
	if err != nil || !ok || c.Row().ID != id {
		t.Fatalf("claim: %v %v", ok, err)
	}
	defer c.Rollback(ctx)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	got, err := p.Publish(pctx, caller, dialects.Message{Group: "g", Payload: []byte("again"), UniqueKey: "k"})
	if !errors.Is(err, dialects.ErrDuplicate) || got != id {
		t.Fatalf("PublishTx of a held key while a claim holds its row: id %d, %v after %v; want %d at once", got, err, time.Since(start), id)
	}
}

// Publishes of one key through the pool wait for a caller's transaction that inserted
// the key; when it rolls back, they race for the freed key. InnoDB may end one of them
// with a deadlock (error 1213): each must still come back with the one row's id.
func TestUniquePublishesRacingForARolledBackKeyReturnOneID(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "rajc_d", func(name string) dialects.Table {
		tb := leaseTable(name)
		tb.UniqueKey = "ukey"
		return tb
	})
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		key := fmt.Sprintf("k%d", round)
		caller, err := d.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Publish(ctx, caller, dialects.Message{Group: "g", Payload: []byte("x"), UniqueKey: key}); err != nil {
			t.Fatal(err)
		}
		const n = 4
		ids, errs := make([]int64, n), make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ids[i], errs[i] = p.Publish(ctx, nil, dialects.Message{Group: "g", Payload: []byte("x"), UniqueKey: key})
			}()
		}
		time.Sleep(300 * time.Millisecond) // the publishes wait for the caller's insert
		if err := caller.Rollback(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		inserted := 0
		for i := range n {
			if errs[i] == nil {
				inserted++
			}
			if errs[i] != nil && !errors.Is(errs[i], dialects.ErrDuplicate) || ids[i] != ids[0] {
				t.Errorf("round %d: publish %d of key %s: id %d, %v (publish 0: id %d, %v)", round, i, key, ids[i], errs[i], ids[0], errs[0])
			}
		}
		if inserted != 1 {
			t.Errorf("round %d: %d of %d publishes of the freed key inserted it, want 1 (the others say ErrDuplicate)", round, inserted, n)
		}
	}
}
