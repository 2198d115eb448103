package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/outbox"
)

// TestOutbox runs every case on every database: one behaviour, proven on each.
func TestOutbox(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"RolledBackRecordIsNeverSent", testRolledBack},
		{"WakeSendsAtOnce", testWake},
		{"RelayKilledBetweenSendAndStampResendsAndDedupeSeesItOnce", testKilledRelay},
		{"RelayProcessKilledBetweenSendAndStampResends", testProcessKilled},
		{"RetriedRecordStaysUnprocessedUntilAcked", testRetried},
		{"NoRecordLostAcrossRestartsOfEitherSide", testRestarts},
		{"FailingSinkBacksOffAndRecovers", testBackoff},
		{"FailingDatabaseBacksOffAndRecovers", testDatabaseFault},
		{"RefusesATableItCannotServe", testRefuses},
		{"DedupeOncePerRecord", testDedupe},
		{"MalformedHeadersAreSentAsFarAsTheyRead", testMalformedHeaders},
	}
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, newEnv(t, db)) })
			}
		})
	}
}

// collect is a sink that keeps what it was sent.
type collect struct {
	mu   sync.Mutex
	recs []outbox.Record
}

func (c *collect) Send(_ context.Context, r outbox.Record) error {
	c.mu.Lock()
	c.recs = append(c.recs, r)
	c.mu.Unlock()
	return nil
}

func (c *collect) ids() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]int64, len(c.recs))
	for i, r := range c.recs {
		ids[i] = r.ID
	}
	return ids
}

// A record whose headers column holds values that are not strings (written by hand, or
// by another program) is sent with every header: those values as their JSON text.
func testMalformedHeaders(t *testing.T, e *env) {
	ob := e.newOutbox()
	id := e.record(ob, "orders", "x", true)
	tb := ob.Table()
	if err := e.db.exec(e.obD, "UPDATE "+tb.Name+" SET "+tb.Headers+" = ? WHERE "+tb.ID+" = ?", `{"k":"x","n":1,"o":{"a":[true]}}`, id); err != nil {
		t.Fatal(err)
	}
	sink := &collect{}
	r, err := ob.StartRelay(sink, outbox.PollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r)
	eventually(t, 10*time.Second, "the record is sent", func() bool { return len(sink.ids()) == 1 })
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	want := map[string]string{"k": "x", "n": "1", "o": `{"a":[true]}`, outbox.IDHeader: strconv.FormatInt(id, 10), outbox.TableHeader: tb.Name}
	if got := sink.recs[0].Headers; !maps.Equal(got, want) {
		t.Fatalf("sent headers %v, want %v", got, want)
	}
}

// A record written in a transaction that rolls back never exists, so nothing is sent for
// it; the one committed beside it is sent, with its id and own headers.
func testRolledBack(t *testing.T, e *env) {
	ob := e.newOutbox()
	gone := e.record(ob, "orders", "rolled-back", false)
	kept := e.record(ob, "orders", "committed", true)

	sink := &collect{}
	r, err := ob.StartRelay(sink, outbox.PollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r)
	eventually(t, 10*time.Second, "the committed record is stamped sent", func() bool {
		rows := e.rows(ob)
		return len(rows) == 1 && rows[0].sent
	})
	time.Sleep(100 * time.Millisecond) // a few more polls: nothing else may be sent
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	rows := e.rows(ob)
	if len(rows) != 1 || rows[0].id != kept || !rows[0].sent || rows[0].processed {
		t.Fatalf("outbox rows = %+v, want only record %d, sent and unprocessed (record %d rolled back)", rows, kept, gone)
	}
	// SQLite hands a rolled-back id out again (its sequence rolls back too); the servers'
	// sequences do not.
	if st, err := ob.Status(context.Background(), gone); gone != kept && (err != nil || st.Exists) {
		t.Fatalf("Status(rolled back %d) = %+v, %v; want no record", gone, st, err)
	}
	if ids := sink.ids(); len(ids) != 1 || ids[0] != kept {
		t.Fatalf("sent %v, want [%d]", ids, kept)
	}
	got := sink.recs[0]
	if got.Topic != "orders" || string(got.Payload) != "committed" || got.Headers["k"] != "committed" ||
		got.Headers[outbox.IDHeader] != fmt.Sprint(kept) || got.Headers[outbox.TableHeader] != ob.Table().Name {
		t.Fatalf("sent %+v", got)
	}
}

// A relay polling once an hour sends a record at once when woken after the commit.
func testWake(t *testing.T, e *env) {
	ob := e.newOutbox()
	sink := &collect{}
	r, err := ob.StartRelay(sink, outbox.PollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r)
	time.Sleep(50 * time.Millisecond) // let the start-up pass find nothing
	id := e.record(ob, "orders", "woken", true)
	ob.Wake()
	eventually(t, 5*time.Second, "the woken relay sends the record", func() bool { return len(sink.ids()) == 1 })
	st, err := ob.Status(context.Background(), id)
	if err != nil || !st.Sent() || st.Processed() {
		t.Fatalf("Status = %+v, %v; want sent, unprocessed", st, err)
	}
}

// consumer is a transactional handler that makes its effect (a row in effects) once per
// record through a Dedupe, and counts what it saw.
type consumer struct {
	e       *env
	dd      *outbox.Dedupe
	effects string
	// together, when set, holds each record's copies until that many are in work at once,
	// so the dedupe (not the processed check) must tell the copies apart.
	together map[int64]int

	mu       sync.Mutex
	arrived  map[int64]int
	released map[int64]chan struct{}
	calls    atomic.Int64
	skipped  atomic.Int64
	// panicOnce makes the handler panic on the first delivery of these records (after
	// its effect, which the panic rolls back), as a consumer dying mid-delivery.
	panicOnce map[int64]bool
	panics    atomic.Int64
}

func newConsumer(e *env, together map[int64]int) *consumer {
	dd, effects := e.consumerTables()
	return &consumer{e: e, dd: dd, effects: effects, together: together,
		arrived: map[int64]int{}, released: map[int64]chan struct{}{}}
}

func (c *consumer) handle(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
	c.calls.Add(1)
	id, ok := outbox.RecordID(d)
	if !ok {
		c.e.t.Errorf("delivery %d carries no record id (headers %v)", d.ID(), d.Headers())
		return rowactor.Drop()
	}
	if n := c.together[id]; n > 1 {
		c.mu.Lock()
		c.arrived[id]++
		ch := c.released[id]
		if ch == nil {
			ch = make(chan struct{})
			c.released[id] = ch
		}
		if c.arrived[id] == n {
			close(ch)
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			c.e.t.Errorf("the %d copies of record %d were never in work together", n, id)
		}
	}
	first, err := c.dd.Once(ctx, d.Tx(), id)
	if err != nil {
		c.e.t.Logf("dedupe: %v", err)
		return rowactor.Retry()
	}
	if !first {
		c.skipped.Add(1)
		return rowactor.Ack()
	}
	if err := c.e.db.txExec(ctx, d.Tx(), "INSERT INTO "+c.effects+" (record_id) VALUES (?)", id); err != nil {
		c.e.t.Logf("effect: %v", err)
		return rowactor.Retry()
	}
	c.mu.Lock()
	die := c.panicOnce[id]
	delete(c.panicOnce, id)
	c.mu.Unlock()
	if die {
		c.panics.Add(1)
		panic(fmt.Sprintf("consumer dies mid-delivery of record %d", id))
	}
	return rowactor.Ack()
}

// effectsOf counts the effect rows of each record.
func (c *consumer) effectsOf() map[int64]int {
	out := map[int64]int{}
	for _, r := range c.e.db.ints(c.e.t, c.e.conD, "SELECT record_id, COUNT(*) FROM "+c.effects+" GROUP BY record_id") {
		out[r[0]] = int(r[1])
	}
	return out
}

func (c *consumer) subscribe(b *rowactor.Broker, ob *outbox.Outbox, q rowactor.Table, workers int) {
	c.e.t.Helper()
	if _, err := b.Subscribe(context.Background(), q, "orders", ob.Handler(c.handle),
		rowactor.Workers(workers), rowactor.Transactional(), rowactor.PollInterval(50*time.Millisecond)); err != nil {
		c.e.t.Fatalf("Subscribe: %v", err)
	}
}

// A relay stopped after its sink took a record and before the stamp (its send cut off, as
// a kill would) leaves the record unsent; the next relay sends every unprocessed record
// again, and the consumer's dedupe makes each effect once though copies are in work at
// the same time.
func testKilledRelay(t *testing.T, e *env) {
	ob := e.newOutbox()
	q := e.queueTable()
	b := e.broker(ob)
	qs, err := outbox.NewQueueSink(b, q, "")
	if err != nil {
		t.Fatal(err)
	}
	ids := []int64{e.record(ob, "orders", "a", true), e.record(ob, "orders", "b", true), e.record(ob, "orders", "c", true)}

	// The first relay dies right after its sink took the second record.
	taken := make(chan struct{})
	dying := outbox.SinkFunc(func(ctx context.Context, r outbox.Record) error {
		if err := qs.Send(ctx, r); err != nil {
			return err
		}
		if r.ID == ids[1] {
			close(taken)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	r1, err := ob.StartRelay(dying)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-taken:
	case <-time.After(10 * time.Second):
		t.Fatal("the first relay never sent the second record")
	}
	cut, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r1.Stop(cut); err == nil {
		t.Fatal("Stop with a spent context reported no cut-off send")
	}
	rows := e.rows(ob)
	if len(rows) != 3 || !rows[0].sent || rows[1].sent || rows[2].sent {
		t.Fatalf("after the kill: outbox rows %+v, want only the first stamped sent", rows)
	}
	if n := e.count(e.conD, "SELECT COUNT(*) FROM "+q.Name); n != 2 {
		t.Fatalf("after the kill: %d queue rows, want 2 (the second record was delivered, not stamped)", n)
	}

	// The next relay sends all three again: none is processed yet.
	r2, err := ob.StartRelay(qs)
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r2)
	eventually(t, 10*time.Second, "the restarted relay sends every unprocessed record", func() bool { return r2.Sent() == 3 })
	for _, row := range e.rows(ob) {
		if !row.sent || row.processed {
			t.Fatalf("after the restart: outbox row %+v, want sent and unprocessed", row)
		}
	}
	if n := e.count(e.conD, "SELECT COUNT(*) FROM "+q.Name); n != 5 {
		t.Fatalf("after the restart: %d queue rows, want 5", n)
	}

	// Each record's copies are in work together: the processed check cannot tell them
	// apart, the dedupe must.
	c := newConsumer(e, map[int64]int{ids[0]: 2, ids[1]: 2, ids[2]: 1})
	c.subscribe(b, ob, q, 8)
	eventually(t, 20*time.Second, "every record is processed and the queue is empty", func() bool {
		for _, row := range e.rows(ob) {
			if !row.processed {
				return false
			}
		}
		return e.count(e.conD, "SELECT COUNT(*) FROM "+q.Name) == 0
	})
	got := c.effectsOf()
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("effects per record %v, want one for each of %v", got, ids)
		}
	}
	if len(got) != 3 || c.calls.Load() != 5 || c.skipped.Load() != 2 {
		t.Fatalf("effects %v, handler calls %d, dedupe skips %d; want 3 effects, 5 calls, 2 skips",
			got, c.calls.Load(), c.skipped.Load())
	}
}

// A record whose consumer retries stays sent and unprocessed, and a running relay does
// not send it again; the next relay start does, and once the consumer acks it is
// processed. The retried copy, when it comes due, is acked without the handler.
func testRetried(t *testing.T, e *env) {
	ob := e.newOutbox()
	q := e.queueTable()
	b := e.broker(ob)
	qs, err := outbox.NewQueueSink(b, q, "")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		if calls.Add(1) == 1 {
			return rowactor.RetryAfter(time.Hour)
		}
		return rowactor.Ack()
	}
	if _, err := b.Subscribe(context.Background(), q, "orders", ob.Handler(h), rowactor.PollInterval(20*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	id := e.record(ob, "orders", "retried", true)
	r1, err := ob.StartRelay(qs, outbox.PollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r1)
	eventually(t, 10*time.Second, "the consumer retries the first delivery", func() bool { return calls.Load() == 1 })
	time.Sleep(200 * time.Millisecond) // ten polls of the relay and of the queue
	rows := e.rows(ob)
	if len(rows) != 1 || !rows[0].sent || rows[0].processed {
		t.Fatalf("after the retry: outbox rows %+v, want sent and unprocessed", rows)
	}
	if r1.Sent() != 1 || calls.Load() != 1 {
		t.Fatalf("a running relay sent the record %d times and the handler ran %d times; want once each", r1.Sent(), calls.Load())
	}
	if n := e.count(e.conD, "SELECT COUNT(*) FROM "+q.Name+" WHERE retry_after IS NOT NULL"); n != 1 {
		t.Fatalf("%d delayed queue rows, want the retried one", n)
	}
	if err := r1.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	r2, err := ob.StartRelay(qs)
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r2)
	eventually(t, 10*time.Second, "the restarted relay's copy is acked and the record processed", func() bool {
		rows := e.rows(ob)
		return len(rows) == 1 && rows[0].processed
	})
	if r2.Sent() != 1 || calls.Load() != 2 {
		t.Fatalf("the restarted relay sent %d, the handler ran %d times; want 1 and 2", r2.Sent(), calls.Load())
	}
	st, err := ob.Status(context.Background(), id)
	if err != nil || !st.Processed() || st.ProcessedAt.Before(st.SentAt.Add(-time.Second)) {
		t.Fatalf("Status = %+v, %v", st, err)
	}

	// The delayed first copy, once due, finds the record processed: acked, no handler.
	if err := e.db.exec(e.conD, "UPDATE "+q.Name+" SET retry_after = NULL"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the delayed copy is acked", func() bool {
		return e.count(e.conD, "SELECT COUNT(*) FROM "+q.Name) == 0
	})
	if calls.Load() != 2 {
		t.Fatalf("the handler ran %d times; a copy of a processed record must not run it", calls.Load())
	}
}

// Records written while the relay and the consumer each restart (the relay cut off
// mid-send as a kill would, the consumer shut down and started again, and its handler
// panicking on the first delivery of every seventh record) all end processed, each with
// exactly one effect, counted by id; records rolled back never appear.
//
// The consumer is shut down with time to drain: a Shutdown whose context ends while a
// handler runs trips a data race inside rowactor's delivery actor (actors/delivery.go,
// run's write of handlerTook against finishSpan's read), reported separately.
func testRestarts(t *testing.T, e *env) {
	ob := e.newOutbox()
	q := e.queueTable()
	c := newConsumer(e, nil)
	c.panicOnce = map[int64]bool{}

	var committed []int64
	var rolledBack int
	write := func(n int) {
		for i := 0; i < n; i++ {
			commit := (len(committed)+rolledBack)%5 != 4
			id := e.record(ob, "orders", fmt.Sprint(len(committed)+rolledBack), commit)
			if commit {
				committed = append(committed, id)
				if id%7 == 0 {
					c.mu.Lock()
					c.panicOnce[id] = true
					c.mu.Unlock()
				}
				ob.Wake()
			} else {
				rolledBack++
			}
			time.Sleep(3 * time.Millisecond)
		}
	}
	startConsumer := func() *rowactor.Broker {
		b := e.broker(ob)
		c.subscribe(b, ob, q, 4)
		return b
	}
	startRelay := func(b *rowactor.Broker) *outbox.Relay {
		qs, err := outbox.NewQueueSink(b, q, "")
		if err != nil {
			t.Fatal(err)
		}
		r, err := ob.StartRelay(qs, outbox.PollInterval(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		stopAtCleanup(t, r)
		return r
	}
	kill := func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}

	// The relay publishes through a broker of its own, so that the consumer's can go.
	pub, err := rowactor.New(e.conD)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pub.Shutdown(context.Background()) })
	cons := startConsumer()
	relay := startRelay(pub)
	write(20)
	_ = relay.Stop(kill()) // cut off mid-send, as a kill
	write(10)
	relay = startRelay(pub)
	write(10)
	drain, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := cons.Shutdown(drain); err != nil {
		t.Fatal(err)
	}
	cancel()
	write(10)       // sent into the queue with no consumer running
	startConsumer() // shut down by the test's cleanup
	write(10)
	_ = relay.Stop(kill())
	relay = startRelay(pub) // sends again whatever is unprocessed

	eventually(t, 60*time.Second, "every committed record is processed", func() bool {
		for _, row := range e.rows(ob) {
			if !row.processed {
				return false
			}
		}
		return true
	})
	rows := e.rows(ob)
	if len(rows) != len(committed) {
		t.Fatalf("%d outbox rows, want the %d committed (%d rolled back)", len(rows), len(committed), rolledBack)
	}
	got := c.effectsOf()
	for i, id := range committed {
		if rows[i].id != id || !rows[i].sent || !rows[i].processed {
			t.Fatalf("outbox row %+v, want record %d sent and processed", rows[i], id)
		}
		if got[id] != 1 {
			t.Fatalf("record %d made %d effects, want 1 (effects %v)", id, got[id], got)
		}
	}
	if len(got) != len(committed) {
		t.Fatalf("%d records made effects, want %d", len(got), len(committed))
	}
	if c.panics.Load() == 0 {
		t.Fatal("no handler panicked: the case did not exercise a consumer dying mid-delivery")
	}
	eventually(t, 20*time.Second, "every copy in the queue is acked", func() bool {
		return e.count(e.conD, "SELECT COUNT(*) FROM "+q.Name) == 0
	})
	t.Logf("%d records, %d rolled back, %d handler calls, %d panics, %d dedupe skips, %d sends by the last relay",
		len(committed), rolledBack, c.calls.Load(), c.panics.Load(), c.skipped.Load(), relay.Sent())
}

// A sink that fails is tried again after a capped backoff, never in a loop; the record
// stays unsent meanwhile, and is sent once the sink recovers.
func testBackoff(t *testing.T, e *env) {
	ob := e.newOutbox()
	id := e.record(ob, "orders", "x", true)
	var calls atomic.Int64
	var healthy atomic.Bool
	sink := outbox.SinkFunc(func(ctx context.Context, r outbox.Record) error {
		calls.Add(1)
		if !healthy.Load() {
			return errors.New("sink down")
		}
		return nil
	})
	r, err := ob.StartRelay(sink, outbox.PollInterval(10*time.Millisecond), outbox.Backoff(50*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r)
	time.Sleep(time.Second)
	n := calls.Load()
	// Delays drawn from [25, 50], [50, 100], then [100, 200] ms: about 8 tries in a second;
	// a relay retrying in a loop would make thousands.
	if n < 3 || n > 20 {
		t.Fatalf("the failing sink was called %d times in a second; want a few (backoff)", n)
	}
	if rows := e.rows(ob); len(rows) != 1 || rows[0].sent {
		t.Fatalf("outbox rows %+v, want the record unsent", rows)
	}
	healthy.Store(true)
	eventually(t, 5*time.Second, "the record is sent once the sink recovers", func() bool {
		st, err := ob.Status(context.Background(), id)
		return err == nil && st.Sent()
	})
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// failures counts the relay's failed rounds by fault, from its log.
type failures struct {
	slog.Handler
	mu     sync.Mutex
	faults map[string]int
}

func (f *failures) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "rowactor/outbox: relay round failed") {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "fault" {
				f.mu.Lock()
				f.faults[a.Value.String()+"/"+r.Level.String()]++
				f.mu.Unlock()
			}
			return true
		})
	}
	return f.Handler.Handle(ctx, r)
}

func (f *failures) count() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.faults)
}

// A relay whose outbox table goes missing (renamed away: the same statement fails on
// every database as a schema fault) logs an error naming the fault, retries slowly rather
// than in a loop, and sends the record once the table is back.
func testDatabaseFault(t *testing.T, e *env) {
	log := &failures{Handler: testLogger(t).Handler(), faults: map[string]int{}}
	ob := e.newOutbox(outbox.WithLogger(slog.New(log)))
	tb := ob.Table()
	away := tb.Name + "_away"
	if err := e.db.exec(e.obD, "ALTER TABLE "+tb.Name+" RENAME TO "+away); err != nil {
		t.Fatal(err)
	}
	renamedBack := false
	t.Cleanup(func() {
		if !renamedBack {
			_ = e.db.exec(e.obD, "DROP TABLE IF EXISTS "+away)
		}
	})
	sink := &collect{}
	r, err := ob.StartRelay(sink, outbox.PollInterval(10*time.Millisecond), outbox.Backoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, r)
	time.Sleep(time.Second)
	got := log.count()
	// A schema fault starts at ten times the initial delay (200 ms, the cap here): about
	// six tries in a second. A relay retrying in a loop would make thousands.
	if n := got["schema/ERROR"]; n < 2 || n > 12 || len(got) != 1 {
		t.Fatalf("failed rounds by fault/level in a second: %v; want a few schema/ERROR", got)
	}
	tx, commit, rollback := e.db.begin(t, e.obD)
	if err := e.db.txExec(context.Background(), tx, "INSERT INTO "+away+" (topic, payload) VALUES (?, ?)", "orders", []byte("late")); err != nil {
		_ = rollback()
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if err := e.db.exec(e.obD, "ALTER TABLE "+away+" RENAME TO "+tb.Name); err != nil {
		t.Fatal(err)
	}
	renamedBack = true
	eventually(t, 5*time.Second, "the record is sent once the table is back", func() bool {
		rows := e.rows(ob)
		return len(rows) == 1 && rows[0].sent && len(sink.ids()) == 1
	})
}

// A description the live table cannot serve is refused at New, naming the table, the
// column and the fix; so is a dedupe table lacking its column, a queue sink whose table
// cannot carry the id, and a second relay on one outbox.
func testRefuses(t *testing.T, e *env) {
	ctx := context.Background()
	tb := e.outboxTable()

	missing := tb
	missing.ProcessedAt = "done_at"
	_, err := outbox.New(ctx, e.obD, missing)
	var ce *rowactor.ConfigError
	if !errors.As(err, &ce) || ce.Table != tb.Name || ce.Column != "done_at" || !strings.Contains(ce.Fix, "outbox.Schema") {
		t.Fatalf("New with a missing column: %v; want a ConfigError naming table %s, column done_at and outbox.Schema", err, tb.Name)
	}
	if !errors.Is(err, rowactor.ErrConfig) {
		t.Fatalf("%v does not match rowactor.ErrConfig", err)
	}

	absent := tb
	absent.Name = e.name("absent")
	if _, err := outbox.New(ctx, e.obD, absent); !errors.As(err, &ce) || ce.Table != absent.Name || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("New on a missing table: %v", err)
	}

	noSent := tb
	noSent.SentAt = ""
	if _, err := outbox.New(ctx, e.obD, noSent); !errors.As(err, &ce) || ce.Option != "outbox.Table.SentAt" {
		t.Fatalf("New without SentAt: %v", err)
	}

	seen := outbox.DedupeTable{Name: e.name("seen"), ID: "record_id"}
	ddl, err := outbox.DedupeSchema(e.conD, seen)
	if err != nil {
		t.Fatal(err)
	}
	e.create(e.conD, seen.Name, ddl)
	seen.SeenAt = "seen_at"
	if _, err := outbox.NewDedupe(ctx, e.conD, seen); !errors.As(err, &ce) || ce.Column != "seen_at" || ce.Table != seen.Name {
		t.Fatalf("NewDedupe with a missing column: %v", err)
	}

	q := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload"}
	b, err := rowactor.New(e.conD)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = b.Shutdown(ctx) }()
	if _, err := outbox.NewQueueSink(b, q, ""); !errors.As(err, &ce) || ce.Option != "Table.Headers" {
		t.Fatalf("NewQueueSink without headers: %v", err)
	}

	ob, err := outbox.New(ctx, e.obD, tb)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.StartRelay(&collect{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.StartRelay(&collect{}); !errors.Is(err, outbox.ErrRelayRunning) {
		t.Fatalf("a second relay: %v", err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	tx, _, rollback := e.db.begin(t, e.obD)
	defer func() { _ = rollback() }()
	if _, err := ob.Record(ctx, tx, "orders", nil, map[string]string{outbox.IDHeader: "1"}); err == nil {
		t.Fatal("Record accepted the relay's own header")
	}
	if _, err := ob.Record(ctx, nil, "orders", nil, nil); err == nil {
		t.Fatal("Record accepted no transaction")
	}
}

// Once reports the first insert of an id, and a later one as seen; an id whose
// transaction rolled back is not seen.
func testDedupe(t *testing.T, e *env) {
	ctx := context.Background()
	dd, _ := e.consumerTables()
	once := func(id int64, commit bool) bool {
		t.Helper()
		tx, commitTx, rollback := e.db.begin(t, e.conD)
		first, err := dd.Once(ctx, tx, id)
		if err != nil {
			_ = rollback()
			t.Fatal(err)
		}
		if commit {
			err = commitTx()
		} else {
			err = rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		return first
	}
	if !once(7, true) {
		t.Fatal("the first Once(7) reported a record seen before")
	}
	if once(7, true) {
		t.Fatal("the second Once(7) reported a first time")
	}
	if !once(8, false) || !once(8, true) {
		t.Fatal("an id whose transaction rolled back must be new again")
	}
	if _, err := dd.Once(ctx, nil, 9); err == nil {
		t.Fatal("Once accepted no transaction")
	}
}
