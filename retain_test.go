package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/postgres"
)

var retainScenarios = []scenario{
	{
		name:   "retention deletes old finished rows, in one round at a time across brokers, and goes on when one broker stops",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withProcessedAt},
		run:    retentionScenario,
	}, {
		name:   "retention deletes old finished rows while another row of the table is in work, and leaves that row",
		shapes: []tableShape{withProcessedAt},
		run:    retentionBesideWorkScenario,
	}, {
		name:   "retention on a small shared pool starves no delivery and no Shutdown",
		forms:  []rowactor.Form{rowactor.FormRowLock, rowactor.FormAdvisory},
		shapes: []tableShape{withProcessedAt},
		run:    retentionSmallPoolScenario,
	}, {
		name:   "Shutdown stops a retention before it drains, so a handler waiting for the leader's connection finishes",
		forms:  []rowactor.Form{rowactor.FormRowLock},
		shapes: []tableShape{withProcessedAt},
		run:    retentionShutdownScenario,
	}, {
		name:   "a retention round whose session is killed mid-delete stops deleting before another leads",
		forms:  []rowactor.Form{rowactor.FormLease},
		shapes: []tableShape{withProcessedAt},
		run:    retentionKilledRoundScenario,
	},
}

// retentionBesideWorkScenario: a busy queue always has a row in work, so a retention that
// waits for (or is refused by) the hold a claim keeps on its row never deletes anything.
// Ten rows finished long ago go while a handler holds an eleventh; the held row stays,
// and is handled once after.
func retentionBesideWorkScenario(t *testing.T, h *harness, form rowactor.Form) {
	ctx := context.Background()
	b := h.broker()
	old := h.publish(b, 10)
	for _, id := range old {
		h.exec(fmt.Sprintf("UPDATE %s SET processed_at = ? WHERE id = ?", h.table.Name), h.drv.timeValue(time.Now().Add(-time.Hour)), id)
	}
	held := h.publish(b, 1)[0]
	started, release := make(chan struct{}), make(chan struct{})
	c := newCalls()
	h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
		c.add(d)
		if d.ID() == held && c.n.Load() == 1 {
			close(started)
			<-release
		}
		return rowactor.Ack()
	})
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		close(release)
		t.Fatalf("the handler never got row %d\nlogs:\n%s", held, h.logs.String())
	}
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	r, err := b.Retain(ctx, h.table, 300*time.Millisecond, rowactor.RetainEvery(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	waitUntil(t, "the old finished rows to go while a row is in work", func() bool {
		for _, id := range old {
			if h.row(id).exists {
				return false
			}
		}
		return r.Deleted() == int64(len(old))
	})
	if !r.Leading() {
		t.Fatal("the retention deleted the rows and does not lead")
	}
	if st := h.row(held); !st.exists || st.processedAt != nil {
		t.Fatalf("the row in work after retention: %+v", st)
	}
	close(release)
	if s := h.waitSettled(1)[0]; s.ID != held || s.Step != "ack" || s.Err != nil {
		t.Fatalf("settlement %+v", s)
	}
	if got := c.of(held); len(got) != 1 {
		t.Fatalf("the held row was handled %d times", len(got))
	}
}

func retentionScenario(t *testing.T, h *harness, _ rowactor.Form) {
	ctx := context.Background()
	b1, b2 := h.broker(), h.second()
	finish := func(b *rowactor.Broker, n int, at time.Time) []int64 {
		ids := h.publish(b, n)
		for _, id := range ids {
			h.drv.exec(t, h.d, fmt.Sprintf("UPDATE %s SET processed_at = ? WHERE id = ?", h.table.Name), h.drv.timeValue(at), id)
		}
		return ids
	}
	old := finish(b1, 5, time.Now().Add(-2*time.Hour))
	recent := finish(b1, 2, time.Now())
	queued := h.publish(b1, 1)
	opts := []rowactor.RetainOption{rowactor.RetainEvery(50 * time.Millisecond), rowactor.RetainBatch(2)}
	r1, err := b1.Retain(ctx, h.table, time.Hour, opts...)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b2.Retain(ctx, h.table, time.Hour, opts...)
	if err != nil {
		t.Fatal(err)
	}
	gone := func(ids []int64) bool {
		for _, id := range ids {
			if h.row(id).exists {
				return false
			}
		}
		return true
	}
	// Deleted counts a round's rows when the round ends, a moment after they are gone.
	waitUntil(t, "the old finished rows to go and be counted", func() bool {
		return gone(old) && r1.Deleted()+r2.Deleted() >= int64(len(old))
	})
	if d := r1.Deleted() + r2.Deleted(); d != int64(len(old)) {
		t.Fatalf("deleted %d + %d rows, want %d", r1.Deleted(), r2.Deleted(), len(old))
	}
	for _, id := range append(recent, queued...) {
		if !h.row(id).exists {
			t.Fatalf("row %d (recent or queued) was deleted", id)
		}
	}
	// One retention stops; the other goes on alone.
	r1.Stop()
	if r1.Leading() {
		t.Fatal("a stopped retention still leads")
	}
	before := r2.Deleted()
	more := finish(b1, 3, time.Now().Add(-3*time.Hour))
	waitUntil(t, "the other broker to delete the later finished rows and count them", func() bool {
		return gone(more) && r2.Deleted() >= before+int64(len(more))
	})
	if r2.Deleted() != before+int64(len(more)) || r1.Deleted()+r2.Deleted() != int64(len(old)+len(more)) {
		t.Fatalf("deleted after the stop: %d by the stopped one, %d by the other", r1.Deleted(), r2.Deleted()-before)
	}
	if _, err := b2.Retain(ctx, h.table, time.Hour); err == nil {
		t.Fatal("a second Retain of the table on one broker was accepted")
	}

	var ce *rowactor.ConfigError
	noProcessed := h.table
	noProcessed.ProcessedAt = ""
	if _, err := b1.Retain(ctx, noProcessed, time.Hour); !errors.As(err, &ce) || ce.Option != "Table.ProcessedAt" {
		t.Fatalf("Retain of a table without processed_at: %v", err)
	}
	if _, err := b1.Retain(ctx, h.table, 0); !errors.As(err, &ce) {
		t.Fatalf("Retain with keep 0: %v", err)
	}
	if _, err := b1.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b1.Retain(ctx, h.table, time.Hour); !errors.Is(err, rowactor.ErrClosed) {
		t.Fatalf("Retain after Shutdown: %v", err)
	}
}

// retentionSmallPoolScenario: a pool of 2, which the subscriptions budget as 1 for their
// claims and deliveries, leaving one for publishes and handlers' own queries. Each
// handler publishes a row (its own query). A retention on the same broker must not take
// that spare connection away: a round holds a connection only while it runs.
func retentionSmallPoolScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite holds no connection per row")
	}
	ctx := context.Background()
	b := h.brokerOn(d)
	ids := h.publish(b, 3)
	r, err := b.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the retention to lead", r.Leading)
	h.subscribe(b, func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := b.Publish(pctx, h.table, "side", []byte("from the handler")); err != nil {
			return rowactor.Fail(err)
		}
		return rowactor.Ack()
	})
	for range ids {
		select {
		case s := <-h.settled:
			if s.Err != nil || s.Step != "ack" {
				t.Fatalf("a handler's own publish beside a leading retention on a pool of 2: %+v (HandlerErr %v)", s, s.HandlerErr)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("no settlement in 15 s")
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// retentionShutdownScenario: on a pool of 2 the subscription holds one connection for its
// row in work and the leading retention the other; the handler's own publish waits for a
// connection. Shutdown must stop the retention (it is no delivery) before it waits for the
// drain, or the drain waits on the leader it would stop only afterwards.
func retentionShutdownScenario(t *testing.T, h *harness, _ rowactor.Form) {
	d, ok := sizedDialect(t, h, 2)
	if !ok {
		t.Skip("SQLite holds no connection per row")
	}
	ctx := context.Background()
	b := h.brokerOn(d)
	h.publish(b, 1)
	r, err := b.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the retention to lead", r.Leading)
	started := make(chan struct{}, 1)
	h.subscribe(b, func(ctx context.Context, dl *rowactor.Delivery) rowactor.Outcome {
		started <- struct{}{}
		if _, err := b.Publish(ctx, h.table, "side", []byte("from the handler")); err != nil {
			return rowactor.Fail(err)
		}
		return rowactor.Ack()
	}, rowactor.Timeout(time.Minute))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery in 10 s")
	}
	time.Sleep(200 * time.Millisecond) // the handler's publish waits for a connection
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rep, err := b.Shutdown(sctx)
	if err != nil || !rep.Drained {
		t.Fatalf("Shutdown with a handler waiting for the leader's connection: %+v %v", rep, err)
	}
	if s := <-h.settled; s.Step != "ack" {
		t.Fatalf("the handler's delivery: %+v (HandlerErr %v)", s, s.HandlerErr)
	}
}

// retentionKilledRoundScenario: a broker's round whose session PostgreSQL terminates
// mid-delete must stop deleting, so that two brokers never delete as leaders at once.
func retentionKilledRoundScenario(t *testing.T, h *harness, _ rowactor.Form) {
	pd, ok := h.d.(*postgres.Dialect)
	if !ok {
		t.Skip("PostgreSQL's pg_terminate_backend")
	}
	ctx := context.Background()
	if _, err := pd.Pool().Exec(ctx, fmt.Sprintf("INSERT INTO %q (grp, payload, processed_at) SELECT 'q', 'x', now() - interval '2 hours' FROM generate_series(1, 20000)", h.table.Name)); err != nil {
		t.Fatal(err)
	}
	b1, b2 := h.broker(), h.second()
	r1, err := b1.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(time.Hour), rowactor.RetainBatch(1))
	if err != nil {
		t.Fatal(err)
	}
	// Its round runs (and its count is told at the round's end): watch the table.
	waitUntil(t, "the first round to delete", func() bool {
		return h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)) < 20000-10
	})
	if _, err := b2.Retain(ctx, h.table, time.Hour, rowactor.RetainEvery(20*time.Millisecond), rowactor.RetainBatch(1)); err != nil {
		t.Fatal(err)
	}
	// The session holding this table's round key, and only it: other tests' sessions
	// hold advisory keys too.
	key := dialects.LockKey("retain:" + h.table.Name)
	var killed int
	if err := pd.Pool().QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted"+
		" AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)", key).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("kill the round's session: %d %v", killed, err)
	}
	// A count is told at its round's end: the killed round's once it ended; the second
	// broker's round may run for seconds. The table tells who deletes meanwhile.
	waitUntil(t, "the killed round to end", func() bool { return r1.Deleted() > 0 })
	left := func() int { return h.drv.count(t, h.d, fmt.Sprintf("SELECT count(*) FROM %s", h.table.Name)) }
	c := left()
	waitUntil(t, "the second broker to delete", func() bool { return left() < c-10 })
	a1 := r1.Deleted()
	time.Sleep(300 * time.Millisecond)
	if a2 := r1.Deleted(); a2 != a1 || a1 >= 20000 {
		t.Fatalf("the killed round deleted %d rows, then %d more after the second led; want its round ended with its session", a1, a2-a1)
	}
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
