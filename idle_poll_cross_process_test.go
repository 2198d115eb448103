package rowactor_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
)

const eventPoll = 100 * time.Millisecond

// eventLimit is how long after its event a row may wait: ten polls, for a loaded machine.
const eventLimit = 10 * eventPoll

// TestIdlePollFindsRowsFreedByAnotherProcess proves that a row another process frees
// without a wake (row lock rolled back, advisory key freed, lease released, FIFO head acked)
// reaches an idle subscription after that event and within eventLimit.
func TestIdlePollFindsRowsFreedByAnotherProcess(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			name := fmt.Sprintf("%s/%s", drv.name, form)
			if drv.name != "sqlite" {
				t.Run(name+"/row lock held elsewhere rolls back", func(t *testing.T) {
					h := newHarness(t, drv, form)
					eventRowLockRollback(t, h)
				})
			}
			if form == rowactor.FormAdvisory && drv.name != "sqlite" {
				t.Run(name+"/advisory key freed elsewhere", func(t *testing.T) {
					h := newHarness(t, drv, form)
					eventKeyFreed(t, h)
				})
			}
			if form == rowactor.FormLease {
				t.Run(name+"/lease released elsewhere", func(t *testing.T) {
					h := newHarness(t, drv, form)
					eventLeaseReleased(t, h)
				})
				t.Run(name+"/FIFO head acked elsewhere", func(t *testing.T) {
					h := newHarness(t, drv, form, func(tb *rowactor.Table) { tb.FIFO = true })
					eventFIFOHeadAcked(t, h)
				})
			}
			if form == rowactor.FormRowLock {
				t.Run(name+"/FIFO head locked elsewhere commits its ack", func(t *testing.T) {
					h := newHarness(t, drv, form, func(tb *rowactor.Table) { tb.FIFO = true })
					eventFIFOHeadRowLock(t, h)
				})
			}
		}
	}
}

// idleSubscriber starts a broker (no notifications) with the harness's queue and two
// other groups subscribed, all idle.
func idleSubscriber(t *testing.T, h *harness) *handledAt {
	t.Helper()
	b := h.broker(rowactor.WithPollOnly())
	got := newHandledAt()
	for _, g := range []string{h.queue, "idle-1", "idle-2"} {
		if _, err := b.Subscribe(context.Background(), h.table, g, got.handler, rowactor.PollInterval(eventPoll)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * eventPoll)
	return got
}

func (h *handledAt) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case x := <-h.ch:
		t.Fatalf("row %d handled before its event", x.id)
	case <-time.After(d):
	}
}

// afterEvent waits for row id and checks it came after the event at ev, within eventLimit.
func (h *handledAt) afterEvent(t *testing.T, hs *harness, id int64, ev time.Time) {
	t.Helper()
	d := h.wait(t, hs, id, ev, 5*time.Second)
	if d < 0 {
		t.Fatalf("row %d handled %v before its event", id, -d)
	}
	if d > eventLimit {
		t.Fatalf("row %d handled %v after its event, at a %v poll", id, d, eventPoll)
	}
	t.Logf("row %d handled %v after its event", id, d)
}

func (h *harness) q(s string) string { return quoteFor(h.drv.name, s) }

func eventRowLockRollback(t *testing.T, h *harness) {
	got := idleSubscriber(t, h)
	// Due soon; locked by another session first.
	due := time.Now().Add(lockSetup)
	h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, retry_after) VALUES (?, ?, ?)", h.q(h.table.Name)), []byte("x"), h.queue, h.drv.timeValue(due))
	id := int64(h.drv.count(t, h.d, fmt.Sprintf("SELECT max(id) FROM %s", h.q(h.table.Name))))
	_, _, rollback := lockElsewhere(t, h, id, due)
	got.quiet(t, time.Until(due)+600*time.Millisecond) // due since 600 ms, locked
	ev := time.Now()
	if err := rollback(); err != nil {
		t.Fatal(err)
	}
	got.afterEvent(t, h, id, ev)
}

// lockSetup is how long a test's row stays not yet due while another session takes its
// row lock. On a loaded machine the insert and the lock took more than 300 ms, and the
// idle subscription claimed the row first.
const lockSetup = 1500 * time.Millisecond

// lockElsewhere takes row id's lock on a transaction of its own, and fails the test if
// that ended after the row fell due (a subscription may have claimed it first). The
// transaction is rolled back when the test ends unless it ended before, so a failed test
// leaves no lock and no acquired connection behind.
func lockElsewhere(t *testing.T, h *harness, id int64, due time.Time) (tx any, commit, rollback func() error) {
	t.Helper()
	tx, commitTx, rollbackTx := h.drv.begin(t, h.d)
	var ended sync.Once
	var endErr error
	finish := func(f func() error) func() error {
		return func() error { ended.Do(func() { endErr = f() }); return endErr }
	}
	commit, rollback = finish(commitTx), finish(rollbackTx)
	t.Cleanup(func() { _ = rollback() })
	if err := h.drv.txExec(context.Background(), tx, fmt.Sprintf("SELECT id FROM %s WHERE id = ? FOR UPDATE", h.q(h.table.Name)), id); err != nil {
		t.Fatal(err)
	}
	if late := time.Since(due); late >= 0 {
		t.Fatalf("row %d's lock was taken %v after it fell due: the setup was too slow to prove anything", id, late)
	}
	return tx, commit, rollback
}

func eventKeyFreed(t *testing.T, h *harness) {
	got := idleSubscriber(t, h)
	due := time.Now().Add(lockSetup)
	h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, retry_after) VALUES (?, ?, ?)", h.q(h.table.Name)), []byte("x"), h.queue, h.drv.timeValue(due))
	id := int64(h.drv.count(t, h.d, fmt.Sprintf("SELECT max(id) FROM %s", h.q(h.table.Name))))
	key := strings.ReplaceAll(h.table.AdvisoryKey, "{id}", fmt.Sprint(id))
	ctx := context.Background()
	var release func()
	switch d := h.d.(type) {
	case *postgres.Dialect:
		c, err := d.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", key); err != nil {
			t.Fatal(err)
		}
		release = func() {
			if _, err := c.Exec(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", key); err != nil {
				t.Error(err)
			}
			c.Release()
		}
	case *mysql.Dialect:
		c, err := d.DB().Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ok sql.NullInt64
		if err := c.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT(LOWER(DATABASE()), '.', ?), 0)", key).Scan(&ok); err != nil || ok.Int64 != 1 {
			t.Fatalf("GET_LOCK: %v %v", ok, err)
		}
		release = func() {
			if _, err := c.ExecContext(ctx, "DO RELEASE_LOCK(CONCAT(LOWER(DATABASE()), '.', ?))", key); err != nil {
				t.Error(err)
			}
			_ = c.Close()
		}
	}
	var once sync.Once
	free := release
	release = func() { once.Do(free) }
	t.Cleanup(release)
	if late := time.Since(due); late >= 0 {
		t.Fatalf("key %s was taken %v after row %d fell due: the setup was too slow to prove anything", key, late, id)
	}
	if !h.drv.keyLocked(t, h.d, key) {
		t.Fatalf("key %s not held", key)
	}
	got.quiet(t, time.Until(due)+600*time.Millisecond)
	ev := time.Now()
	release()
	got.afterEvent(t, h, id, ev)
}

func eventLeaseReleased(t *testing.T, h *harness) {
	got := idleSubscriber(t, h)
	h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, locked_until) VALUES (?, ?, ?)", h.q(h.table.Name)), []byte("x"), "idle-2", h.drv.timeValue(time.Now().Add(time.Hour)))
	id := int64(h.drv.count(t, h.d, fmt.Sprintf("SELECT max(id) FROM %s", h.q(h.table.Name))))
	got.quiet(t, 5*eventPoll)
	ev := time.Now()
	h.exec(fmt.Sprintf("UPDATE %s SET locked_until = NULL WHERE id = ?", h.q(h.table.Name)), id)
	got.afterEvent(t, h, id, ev)
}

// eventFIFOHeadAcked: the head is leased by another process; the row behind it waits
// until that process acks the head (deletes it).
func eventFIFOHeadAcked(t *testing.T, h *harness) {
	got := idleSubscriber(t, h)
	tn := h.q(h.table.Name)
	h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, locked_until) VALUES (?, ?, ?)", tn), []byte("head"), h.queue, h.drv.timeValue(time.Now().Add(time.Hour)))
	head := int64(h.drv.count(t, h.d, fmt.Sprintf("SELECT max(id) FROM %s", tn)))
	h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp) VALUES (?, ?)", tn), []byte("behind"), h.queue)
	id := head + 1
	got.quiet(t, 5*eventPoll)
	ev := time.Now()
	h.exec(fmt.Sprintf("DELETE FROM %s WHERE id = ?", tn), head)
	got.afterEvent(t, h, id, ev)
}

// eventFIFOHeadRowLock: the head is held under another session's row lock; that session
// deletes it and commits.
func eventFIFOHeadRowLock(t *testing.T, h *harness) {
	got := idleSubscriber(t, h)
	tn := h.q(h.table.Name)
	due := time.Now().Add(lockSetup)
	h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp, retry_after) VALUES (?, ?, ?)", tn), []byte("head"), h.queue, h.drv.timeValue(due))
	head := int64(h.drv.count(t, h.d, fmt.Sprintf("SELECT max(id) FROM %s", tn)))
	h.exec(fmt.Sprintf("INSERT INTO %s (payload, grp) VALUES (?, ?)", tn), []byte("behind"), h.queue)
	id := head + 1
	tx, commit, _ := lockElsewhere(t, h, head, due)
	// The head is locked, and the row behind waits for it.
	got.quiet(t, time.Until(due)+600*time.Millisecond)
	if err := h.drv.txExec(context.Background(), tx, fmt.Sprintf("DELETE FROM %s WHERE id = ?", tn), head); err != nil {
		t.Fatal(err)
	}
	ev := time.Now()
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	got.afterEvent(t, h, id, ev)
}
