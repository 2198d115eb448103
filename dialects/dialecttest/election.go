package dialecttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// electionScenarios are the Elector's and the UniqueKeyReader's (periodic jobs).
var electionScenarios = []scenario{
	{name: "ElectRunsAndLetsGo", run: testElectRunsAndLetsGo},
	{name: "ElectWaitsForTheHolder", run: testElectWaitsForTheHolder},
	{name: "ElectHeldElsewhere", run: testElectHeldElsewhere,
		applies: func(h Harness) bool { _, ok := h.(KeyInspector); return ok }},
	{name: "NewestUniqueKey", run: testNewestUniqueKey},
	{name: "ElectCommitsFnsWrites", run: testElectCommitsFnsWrites},
}

func elector(t *testing.T, d dialects.Dialect) dialects.Elector {
	t.Helper()
	el, ok := d.(dialects.Elector)
	if !ok {
		t.Fatalf("%T is not a dialects.Elector", d)
	}
	return el
}

// Elect runs fn under the lock and returns fn's error; the lock is free once it returns.
func testElectRunsAndLetsGo(t *testing.T, h Harness) {
	e := setup(t, h)
	lock := e.name("ra_elect")
	ran := 0
	boom := errors.New("boom")
	led, err := elector(t, e.d).Elect(ctx, lock, 0, func(ctx context.Context, _ any) error { ran++; return boom })
	if !led || !errors.Is(err, boom) || ran != 1 {
		t.Fatalf("Elect: led %v, err %v, fn ran %d times; want led, fn's error, once", led, err, ran)
	}
	led, err = elector(t, e.other().d).Elect(ctx, lock, 0, func(ctx context.Context, _ any) error { ran++; return nil })
	if !led || err != nil || ran != 2 {
		t.Fatalf("Elect once the lock is free: led %v, err %v", led, err)
	}
}

// While one dialect's fn runs, another's Elect waits: a short wait gives up without
// running fn; a long one runs fn once the first let the lock go, never beside it.
func testElectWaitsForTheHolder(t *testing.T, h Harness) {
	e := setup(t, h)
	lock := e.name("ra_elect")
	a, b := elector(t, e.d), elector(t, e.other().d)
	inA, releaseA := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Elect(ctx, lock, 0, func(ctx context.Context, _ any) error {
			note("a in")
			close(inA)
			<-releaseA
			note("a out")
			return nil
		})
		aDone <- err
	}()
	<-inA
	if led, err := b.Elect(ctx, lock, 50*time.Millisecond, func(ctx context.Context, _ any) error { note("b short"); return nil }); led || err != nil {
		t.Fatalf("Elect while another holds the lock, waiting 50 ms: led %v, err %v; want not led", led, err)
	}
	bDone := make(chan bool, 1)
	go func() {
		led, err := b.Elect(ctx, lock, 10*time.Second, func(ctx context.Context, _ any) error { note("b in"); return nil })
		if err != nil {
			t.Error(err)
		}
		bDone <- led
	}()
	time.Sleep(100 * time.Millisecond) // b waits in the lock's queue
	close(releaseA)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if !<-bDone {
		t.Fatal("a waiting Elect did not lead once the holder let the lock go")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a in", "a out", "b in"}; len(order) != 3 || order[0] != want[0] || order[1] != want[1] || order[2] != want[2] {
		t.Fatalf("runs %v, want %v", order, want)
	}
}

// A lock another session (another service) holds keeps Elect out.
func testElectHeldElsewhere(t *testing.T, h Harness) {
	e := setup(t, h)
	lock := e.name("ra_elect")
	release := h.(KeyInspector).HoldKey(t, e.d, dialects.LockKey(lock))
	var once sync.Once
	t.Cleanup(func() { once.Do(release) })
	if led, err := elector(t, e.d).Elect(ctx, lock, 20*time.Millisecond, func(ctx context.Context, _ any) error { return nil }); led || err != nil {
		t.Fatalf("Elect of a lock another session holds: led %v, err %v", led, err)
	}
	once.Do(release)
	if led, err := elector(t, e.d).Elect(ctx, lock, 0, func(ctx context.Context, _ any) error { return nil }); !led || err != nil {
		t.Fatalf("Elect once it is free: led %v, err %v", led, err)
	}
	if n := h.(KeyInspector).LocksHeld(t, e.d, dialects.LockKey(lock)); n != 0 {
		t.Fatalf("%d sessions hold the lock after Elect returned", n)
	}
}

// NewestUniqueKey finds the greatest key in the range (here the keys starting "s@"),
// byte by byte, among rows of every state; keys that only share a shorter prefix, or sort
// after the range, do not count.
func testNewestUniqueKey(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_nuk", func(name string) dialects.Table {
		tb := LeaseTable(name)
		tb.UniqueKey = "ukey"
		tb.ProcessedAt = "processed_at"
		return tb
	})
	r, ok := e.d.(dialects.UniqueKeyReader)
	if !ok {
		t.Fatalf("%T is not a dialects.UniqueKeyReader", e.d)
	}
	if _, found, err := r.NewestUniqueKey(ctx, nil, tbl, "s@", "sA"); found || err != nil {
		t.Fatalf("an empty table: found %v, err %v", found, err)
	}
	for _, k := range []string{"s@2030-01-02T03:04:05Z", "s@2030-01-02T03:04:07Z", "s@2030-01-02T03:04:06Z",
		"s", "s@", "sA@2099", "s?2099", "t@2099", "S@2099"} {
		e.publish(tbl, dialects.Message{Group: "g", Payload: []byte(k), UniqueKey: k})
	}
	e.publish(tbl, dialects.Message{Group: "other", Payload: []byte("no key")})
	// The newest is finished: rows of every state count.
	e.exec("UPDATE "+e.q(tbl.Name)+" SET processed_at = ? WHERE ukey = ?", e.h.TimeArg(t0), "s@2030-01-02T03:04:07Z")
	if k, found, err := r.NewestUniqueKey(ctx, nil, tbl, "s@", "sA"); k != "s@2030-01-02T03:04:07Z" || !found || err != nil {
		t.Fatalf("NewestUniqueKey(s@) = %q %v %v", k, found, err)
	}
	var ce *dialects.ConfigError
	noKey := tbl
	noKey.UniqueKey = ""
	if _, _, err := r.NewestUniqueKey(ctx, nil, noKey, "s@", "sA"); !errors.As(err, &ce) {
		t.Fatalf("a table without a unique key column: %v, want a *ConfigError", err)
	}
	wrong := tbl
	wrong.UniqueKey = "no_such_column"
	if _, _, err := r.NewestUniqueKey(ctx, nil, wrong, "s@", "sA"); !errors.As(err, &ce) {
		t.Fatalf("a description the table does not match: %v, want a *ConfigError", err)
	}
	if _, _, err := r.NewestUniqueKey(ctx, nil, tbl, "s", "s"); err == nil {
		t.Fatal("an empty range was accepted")
	}
}

// fn's writes in Elect's transaction commit with it, and are rolled back when fn fails;
// a read in the transaction sees them. (SQLite gives no transaction: fn's writes go
// through the pool, and stay.)
func testElectCommitsFnsWrites(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_elw", func(name string) dialects.Table {
		tb := LeaseTable(name)
		tb.UniqueKey = "ukey"
		tb.ProcessedAt = "processed_at"
		return tb
	})
	p, err := e.d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	r := e.d.(dialects.UniqueKeyReader)
	lock := e.name("ra_elect")
	boom := errors.New("boom")
	for i, fail := range []bool{true, false} {
		key := fmt.Sprintf("s@%d", i)
		inTx := false
		led, err := elector(t, e.d).Elect(ctx, lock, time.Second, func(ctx context.Context, tx any) error {
			inTx = tx != nil
			if _, err := p.Publish(ctx, tx, dialects.Message{Group: "g", Payload: []byte("run"), UniqueKey: key}); err != nil {
				return err
			}
			if k, found, err := r.NewestUniqueKey(ctx, tx, tbl, "s@", "sA"); err != nil || !found || k != key {
				return fmt.Errorf("the read in the transaction: %q %v %v", k, found, err)
			}
			if fail {
				return boom
			}
			return nil
		})
		if !led || (fail && !errors.Is(err, boom)) || (!fail && err != nil) {
			t.Fatalf("Elect (fn fails: %v): led %v, err %v", fail, led, err)
		}
		want := 1
		if fail && inTx {
			want = 0
		}
		if inTx == e.caps.SingleWriter {
			t.Fatalf("Elect's fn was given a transaction: %v; want one unless the database has a single writer (SQLite)", inTx)
		}
		if n := e.count("SELECT count(*) FROM "+e.q(tbl.Name)+" WHERE ukey = ?", key); n != want {
			t.Fatalf("fn fails: %v: %d rows of its publish, want %d", fail, n, want)
		}
	}
}
