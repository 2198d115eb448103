package rowactor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// side is a table of the scenario's own that transactional handlers write to, so the
// suite can tell which writes committed.
func (h *harness) side() rowactor.Table {
	h.t.Helper()
	s := rowactor.Table{Name: h.table.Name + "_side", ID: "id", Payload: "payload"}
	h.createTable(s)
	return s
}

func (h *harness) sideRows(s rowactor.Table, note string) int {
	h.t.Helper()
	return h.drv.count(h.t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE payload = ?", s.Name), []byte(note))
}

// write inserts a note into the side table through the delivery's transaction.
func (h *harness) write(ctx context.Context, d *rowactor.Delivery, s rowactor.Table, note string) {
	if d.Tx() == nil {
		panic("a transactional delivery has no transaction")
	}
	if err := h.drv.txExec(ctx, d.Tx(), fmt.Sprintf("INSERT INTO %s (payload) VALUES (?)", s.Name), []byte(note)); err != nil {
		panic(fmt.Sprintf("write through the delivery's transaction: %v", err))
	}
}

// transactionalCoreScenarios run with Transactional() over every (database, form).
var transactionalCoreScenarios = []scenario{
	{name: "a shutdown that outlasts its deadline rolls back a running handler's transaction and releases its row", run: func(t *testing.T, h *harness, form rowactor.Form) {
		s := h.side()
		b := h.broker()
		var calls atomic.Int64
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if calls.Add(1) > 1 {
				return rowactor.Ack()
			}
			h.write(context.Background(), d, s, "abandoned")
			<-ctx.Done() // the shutdown's deadline passed: the handler is told to stop
			return rowactor.Ack()
		}, append(leaseOptions(form, time.Hour), rowactor.Transactional())...)
		id := h.publish(b, 1)[0]
		waitFor(t, func() bool { return calls.Load() == 1 })
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		rep, err := b.Shutdown(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || rep.Drained || rep.Released != 1 {
			t.Fatalf("Shutdown: %+v, %v; want not drained, one row released, the deadline reported", rep, err)
		}
		if st := h.waitSettled(1)[0]; !errors.Is(st.Err, rowactor.ErrClosed) || !st.Released {
			t.Fatalf("settlement %+v, want the row released with ErrClosed", st)
		}
		if n := h.sideRows(s, "abandoned"); n != 0 {
			t.Fatalf("the abandoned handler's write committed (%d rows)", n)
		}
		if st := h.row(id); !st.exists || st.lockedUntil != nil {
			t.Fatalf("row after shutdown: %+v", st)
		}
		// Nothing of the delivery is left holding the row: another broker takes it at once.
		h.subscribe(h.second(), func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() })
		if st := h.waitSettled(1)[0]; st.Err != nil || st.ID != id {
			t.Fatalf("redelivery %+v", st)
		}
	}},
	{name: "ack commits the handler's writes with the settlement", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		s := h.side()
		b := h.broker()
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			h.write(ctx, d, s, fmt.Sprint("done-", d.ID()))
			return rowactor.Ack()
		}, rowactor.Transactional(), rowactor.Workers(2))
		ids := h.publish(b, 3)
		for _, st := range h.waitSettled(3) {
			if st.Err != nil || st.Step != "ack" {
				t.Fatalf("settlement %+v", st)
			}
		}
		for _, id := range ids {
			if h.row(id).exists || h.sideRows(s, fmt.Sprint("done-", id)) != 1 {
				t.Fatalf("row %d: queue row exists=%v, handler writes=%d", id, h.row(id).exists, h.sideRows(s, fmt.Sprint("done-", id)))
			}
		}
	}},
	{name: "the delivery's *sql.Tx and its driver transaction are one transaction, ended by the settlement", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		s := h.side()
		b := h.broker()
		type seen struct {
			rows    int64
			payload []byte
			err     error
		}
		got := make(chan seen, 1)
		lent := make(chan *sql.Tx, 1)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			// Written through the driver's own transaction (pgx.Tx on PostgreSQL), read
			// back through the *sql.Tx: uncommitted, so only the same transaction sees it.
			if err := h.drv.txExec(ctx, d.DriverTx(), fmt.Sprintf("INSERT INTO %s (payload) VALUES (?)", s.Name), []byte("through the driver")); err != nil {
				got <- seen{err: err}
				return rowactor.Retry()
			}
			var r seen
			r.err = d.Tx().QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM "+s.Name+"), payload FROM "+s.Name).Scan(&r.rows, &r.payload)
			got <- r
			lent <- d.Tx()
			return rowactor.Ack()
		}, rowactor.Transactional())
		h.publish(b, 1)
		r := <-got
		if r.err != nil || r.rows != 1 || string(r.payload) != "through the driver" {
			t.Fatalf("through the *sql.Tx the handler read %d rows, payload %q, error %v; want its own uncommitted write", r.rows, r.payload, r.err)
		}
		if st := h.waitSettled(1)[0]; st.Err != nil || st.Step != "ack" {
			t.Fatalf("settlement %+v", st)
		}
		if n := h.sideRows(s, "through the driver"); n != 1 {
			t.Fatalf("the Ack committed %d side rows, want 1", n)
		}
		// Kept past its handler, the *sql.Tx is over on every database.
		if _, err := (<-lent).ExecContext(context.Background(), "DELETE FROM "+s.Name); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("a statement through the *sql.Tx after the settlement: %v, want sql.ErrTxDone", err)
		}
		if n := h.sideRows(s, "through the driver"); n != 1 {
			t.Fatalf("after the settlement the *sql.Tx deleted the side row (%d left)", n)
		}
	}},
	{name: "retry rolls the handler's writes back and counts the attempt", shapes: []tableShape{withProcessedAt}, run: func(t *testing.T, h *harness, form rowactor.Form) {
		s := h.side()
		b := h.broker()
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			h.write(ctx, d, s, fmt.Sprint("attempt-", d.Attempt()))
			if d.Attempt() == 1 {
				return rowactor.Retry()
			}
			return rowactor.Ack()
		}, rowactor.Transactional())
		id := h.publish(b, 1)[0]
		got := h.waitDeliveries(2)
		if got[0].Step != "retry" || got[1].Step != "ack" || got[1].Attempt != 2 || got[1].Err != nil {
			t.Fatalf("settlements %+v", got)
		}
		if h.sideRows(s, "attempt-1") != 0 || h.sideRows(s, "attempt-2") != 1 {
			t.Fatalf("handler writes: attempt 1 kept %d, attempt 2 kept %d; want 0 and 1", h.sideRows(s, "attempt-1"), h.sideRows(s, "attempt-2"))
		}
		if st := h.row(id); st.processedAt == nil || st.attempt != attemptColumn(form, 2, 1) {
			t.Fatalf("row %+v", st)
		}
	}},
	{name: "drop discards the handler's writes yet ends the row", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		s := h.side()
		b := h.broker()
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			h.write(ctx, d, s, "dropped")
			return rowactor.Drop()
		}, rowactor.Transactional())
		id := h.publish(b, 1)[0]
		if st := h.waitSettled(1)[0]; st.Err != nil || st.Outcome.String() != "drop" {
			t.Fatalf("settlement %+v", st)
		}
		if h.row(id).exists || h.sideRows(s, "dropped") != 0 {
			t.Fatalf("after a drop: row exists=%v, handler writes kept=%d; want false, 0", h.row(id).exists, h.sideRows(s, "dropped"))
		}
	}},
	{name: "a panic rolls the handler's writes back and releases the row", run: func(t *testing.T, h *harness, form rowactor.Form) {
		s := h.side()
		b := h.broker()
		var deliveries atomic.Int64
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			n := deliveries.Add(1)
			h.write(ctx, d, s, fmt.Sprint("delivery-", n))
			if n == 1 {
				panic("boom")
			}
			return rowactor.Ack()
		}, append(leaseOptions(h.table.Form(), time.Hour), rowactor.Transactional())...)
		h.publish(b, 1)
		got := h.waitDeliveries(2)
		if got[0].Step == "ack" { // the release's report may arrive after the redelivery's
			got[0], got[1] = got[1], got[0]
		}
		if got[0].Panic == nil || !got[0].Released || got[1].Err != nil || got[1].Step != "ack" {
			t.Fatalf("settlements %+v", got)
		}
		// The release spends an attempt where the claim counts it, and none in the row lock form.
		if got[1].Attempt != attemptColumn(form, 1, 0) {
			t.Fatalf("redelivered with attempt %d", got[1].Attempt)
		}
		if h.sideRows(s, "delivery-1") != 0 || h.sideRows(s, "delivery-2") != 1 {
			t.Fatal("a panicking handler's writes were kept")
		}
	}},
	{name: "a lost lease rolls back the handler's writes and the ack", forms: []rowactor.Form{rowactor.FormLease}, run: func(t *testing.T, h *harness, _ rowactor.Form) {
		s := h.side()
		b := h.broker()
		other := time.Now().Add(time.Hour).Truncate(time.Second)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			// Another claim takes the row before the handler writes.
			h.exec(fmt.Sprintf("UPDATE %s SET locked_until = ? WHERE id = ?", h.table.Name), h.drv.timeValue(other), d.ID())
			h.write(ctx, d, s, "lost")
			return rowactor.Ack()
		}, rowactor.Transactional())
		id := h.publish(b, 1)[0]
		st := h.waitSettled(1)[0]
		if !errors.Is(st.Err, rowactor.ErrLeaseLost) {
			t.Fatalf("settlement error %v, want ErrLeaseLost", st.Err)
		}
		if h.sideRows(s, "lost") != 0 {
			t.Fatal("a lost lease's handler writes were committed")
		}
		if row := h.row(id); !row.exists || row.lockedUntil == nil || !row.lockedUntil.Equal(other) {
			t.Fatalf("row %+v", row)
		}
	}},
	{name: "rows published through the delivery's transaction commit with the ack and wake subscribers", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			if _, err := b.PublishTx(ctx, d.Tx(), h.table, "next", []byte("chained")); err != nil {
				panic(err)
			}
			if d.Attempt() == 1 {
				return rowactor.Retry() // rolled back: nothing published
			}
			return rowactor.Ack()
		}, rowactor.Transactional())
		next := make(chan *rowactor.Delivery, 4)
		if _, err := b.Subscribe(context.Background(), h.table, "next", func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
			next <- d
			return rowactor.Ack()
		}, rowactor.PollInterval(time.Hour)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // both subscriptions' first claims pass
		h.publish(b, 1)
		select {
		case d := <-next:
			if string(d.Payload()) != "chained" {
				t.Fatalf("payload %q", d.Payload())
			}
		case <-time.After(15 * time.Second):
			t.Fatal("the row published with the ack never woke its subscriber (an hour's poll)")
		}
		select {
		case d := <-next:
			t.Fatalf("a second chained row %d: the retried delivery's publish was kept", d.ID())
		case <-time.After(300 * time.Millisecond):
		}
	}},
	{name: "a row published in the caller's transaction wakes subscribers once it commits", run: func(t *testing.T, h *harness, _ rowactor.Form) {
		b := h.broker()
		h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Ack() }, rowactor.PollInterval(time.Hour))
		time.Sleep(200 * time.Millisecond) // the first (empty) claim passes
		tx, commit, _ := h.drv.begin(t, h.d)
		id, err := b.PublishTx(context.Background(), tx, h.table, h.queue, []byte("outbox"))
		if err != nil {
			t.Fatal(err)
		}
		h.quiet(300 * time.Millisecond)
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		if !h.drv.notifies {
			b.Wake(h.table, h.queue) // without NOTIFY the caller wakes its subscribers
		}
		if st := h.waitSettled(1)[0]; st.ID != id {
			t.Fatalf("settled row %d, want %d", st.ID, id)
		}
	}},
}

func TestTransactionalConformance(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, sc := range transactionalScenarios {
				if sc.forms != nil && !hasForm(sc.forms, form) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", drv.name, form, sc.name), func(t *testing.T) {
					t.Parallel()
					h := newHarness(t, drv, form, sc.shapes...)
					sc.run(t, h, form)
				})
			}
		}
	}
}

// On PostgreSQL the delivery's *sql.Tx is rowactor's own driver over the session, and
// ends before the settlement: rows the handler left open are closed first, so the
// settlement finds the session free and commits (with -race: no two goroutines on it).
func TestTxRowsLeftOpenAreClosedBeforeTheSettlement(t *testing.T) {
	t.Parallel()
	onEveryPostgresForm(t, func(t *testing.T, h *harness, s rowactor.Table, b *rowactor.Broker, form rowactor.Form) {
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			h.write(ctx, d, s, "kept")
			rows, err := d.Tx().QueryContext(ctx, "SELECT g FROM generate_series(1, 100000) g")
			if err != nil {
				panic(err)
			}
			rows.Next() // left open
			return rowactor.Ack()
		}, append(leaseOptions(form, time.Minute), rowactor.Transactional())...)
		h.publish(b, 1)
		if st := h.waitSettled(1)[0]; st.Err != nil || st.Step != "ack" {
			t.Fatalf("settlement %+v", st)
		}
		if n := h.sideRows(s, "kept"); n != 1 {
			t.Fatalf("the Ack committed %d side rows, want 1", n)
		}
	})
}

// On PostgreSQL a statement through the *sql.Tx issued as the handler returns either ran
// before the settlement or fails with sql.ErrTxDone: the Ack never commits what came
// after the handler, and the settlement never shares the session with it.
func TestTxUsedAfterTheHandlerReturnedIsRefused(t *testing.T) {
	t.Parallel()
	onEveryPostgresForm(t, func(t *testing.T, h *harness, s rowactor.Table, b *rowactor.Broker, form rowactor.Form) {
		const n = 20
		results := make(chan error, n)
		h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			tx := d.Tx()
			returned := make(chan struct{})
			defer close(returned)
			go func() {
				<-returned
				_, err := tx.ExecContext(context.Background(), "INSERT INTO "+s.Name+" (payload) VALUES ($1)", []byte("after return"))
				results <- err
			}()
			return rowactor.Ack()
		}, append(leaseOptions(form, time.Minute), rowactor.Transactional(), rowactor.Workers(1))...)
		h.publish(b, n)
		for _, st := range h.waitSettled(n) {
			if st.Err != nil {
				t.Errorf("settlement %+v", st)
			}
		}
		ran := 0
		for range n {
			switch err := <-results; {
			case err == nil:
				ran++
			case !errors.Is(err, sql.ErrTxDone):
				t.Errorf("a statement after the handler returned: %v, want sql.ErrTxDone or success before the end", err)
			}
		}
		if committed := h.sideRows(s, "after return"); committed != ran {
			t.Fatalf("%d writes after the handler returned committed, %d of them ran before the lending's end", committed, ran)
		}
	})
}

// onEveryPostgresForm runs f in a parallel subtest per form on PostgreSQL, whose *sql.Tx
// is rowactor's own driver: with a harness, a side table and a broker.
func onEveryPostgresForm(t *testing.T, f func(t *testing.T, h *harness, side rowactor.Table, b *rowactor.Broker, form rowactor.Form)) {
	drv := driverNamed(t, "postgres")
	for _, form := range drv.forms {
		t.Run(form.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, drv, form)
			f(t, h, h.side(), h.broker(), form)
		})
	}
}
