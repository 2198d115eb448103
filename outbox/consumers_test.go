package outbox_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/outbox"
)

// databaseNamed returns the suite's database of that name.
func databaseNamed(t *testing.T, name string) database {
	for _, db := range databases {
		if db.name == name {
			return db
		}
	}
	t.Fatalf("no database %s", name)
	return database{}
}

// gatedHook is a broker's WithOnSettled hook that holds the first settlement of table
// until the test opens the gate, then passes every settlement on.
type gatedHook struct {
	table   string
	pass    func(rowactor.Settlement)
	entered chan rowactor.Settlement // the first settlement, as it arrives
	passed  chan struct{}            // closed once the first settlement was passed on
	gate    chan struct{}
	open    sync.Once
	first   sync.Once
}

func newGatedHook(t *testing.T, table string) *gatedHook {
	h := &gatedHook{table: table, entered: make(chan rowactor.Settlement, 1), passed: make(chan struct{}), gate: make(chan struct{})}
	return h
}

func (h *gatedHook) release() { h.open.Do(func() { close(h.gate) }) }

func (h *gatedHook) settled(s rowactor.Settlement) {
	if s.Table != h.table {
		h.pass(s)
		return
	}
	first := false
	h.first.Do(func() { first = true })
	if !first {
		h.pass(s)
		return
	}
	h.entered <- s
	<-h.gate
	h.pass(s)
	close(h.passed)
}

// splitDDL splits a schema into its statements.
func splitDDL(ddl string) []string {
	var out []string
	for _, s := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(s) != "" {
			out = append(out, s)
		}
	}
	return out
}

func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("after 30s: %s", what)
		panic("unreachable")
	}
}

// Two transactional consumer brokers on two databases read one outbox through queue
// tables of one name, whose rows have the same ids. Each stamps only its own records: the
// settlement of row 1 on one database never stamps the record a delivery of row 1 on the
// other awaits. Here broker B's ack of record 2 is refused by its database (its effect
// rolled back) while broker A's ack of record 1 committed; record 1 must end processed and
// record 2 unprocessed (it is sent again), never the other way round, which loses record
// 2's message: its next delivery is acked unseen. It holds with a Consumer per broker
// and with the outbox's own pair (ob.Handler, ob.Settled) shared by both brokers, which
// tells their rows apart by Settlement.Broker.
func TestConsumerBrokersOnTwoDatabasesStampOnlyTheirOwnRecords(t *testing.T) {
	type pair struct {
		name   string
		a, b   string
		shared bool
	}
	var pairs []pair
	for _, shared := range []bool{false, true} {
		suffix := "/ConsumerPerBroker"
		if shared {
			suffix = "/SharedOutboxPair"
		}
		pairs = append(pairs, pair{"TwoSQLiteFiles" + suffix, "sqlite", "sqlite", shared},
			pair{"PostgreSQLAndMariaDB" + suffix, "postgres", "mysql", shared})
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dir := t.TempDir()

			// The outbox, in a SQLite file of its own.
			obEnv := newEnv(t, databaseNamed(t, "sqlite"))
			ob := obEnv.newOutbox()
			record := func() int64 { return obEnv.record(ob, "orders", "order", true) }
			r1, r2 := record(), record()

			qName := obEnv.name("jobs")
			type side struct {
				db   database
				d    dialects.Dialect
				q    rowactor.Table
				b    *rowactor.Broker
				hook *gatedHook
			}
			open := func(name, file string) *side {
				db := databaseNamed(t, name)
				at, _ := db.places(t)
				if name == "sqlite" {
					at = filepath.Join(dir, file)
				}
				d, err := db.openAt(ctx, at)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = d.Close() })
				q := rowactor.Table{Name: qName, ID: "id", Payload: "payload", Group: "queue", Attempt: "attempt",
					RetryAfter: "retry_after", LockedUntil: "locked_until", Headers: "headers"}
				ddl, err := rowactor.Schema(d, q)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = db.exec(d, "DROP TABLE IF EXISTS "+qName) })
				for _, stmt := range splitDDL(ddl) {
					if err := db.exec(d, stmt); err != nil {
						t.Fatalf("%s: %v", stmt, err)
					}
				}
				return &side{db: db, d: d, q: q, hook: newGatedHook(t, qName)}
			}
			a, b := open(p.a, "a.db"), open(p.b, "b.db")
			// B's database refuses the ack of its row: the settlement fails and rolls back.
			refuse := map[string]string{
				"sqlite": "CREATE TRIGGER " + qName + "_refuse BEFORE DELETE ON " + qName + " BEGIN SELECT RAISE(ABORT, 'acks refused'); END",
				"mysql":  "CREATE TRIGGER " + qName + "_refuse BEFORE DELETE ON " + qName + " FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'acks refused'",
			}[p.b]
			if err := b.db.exec(b.d, refuse); err != nil {
				t.Fatal(err)
			}

			for _, s := range []*side{a, b} {
				handler, settled := ob.Handler, ob.Settled
				if !p.shared {
					c := ob.Consumer() // one per consumer broker
					handler, settled = c.Handler, c.Settled
				}
				s.hook.pass = settled
				var err error
				s.b, err = rowactor.New(s.d, rowactor.WithOnSettled(s.hook.settled), rowactor.WithLogger(testLogger(t)))
				if err != nil {
					t.Fatal(err)
				}
				sb, hook := s.b, s.hook
				t.Cleanup(func() {
					hook.release() // a held hook holds its delivery, which Shutdown waits for
					_, _ = sb.Shutdown(context.Background())
				})
				if _, err := s.b.Subscribe(ctx, s.q, "orders", handler(func(context.Context, *rowactor.Delivery) rowactor.Outcome {
					return rowactor.Ack()
				}), rowactor.Transactional(), rowactor.Lease(time.Minute)); err != nil {
					t.Fatal(err)
				}
			}
			publish := func(s *side, rec int64) {
				t.Helper()
				if _, err := s.b.Publish(ctx, s.q, "orders", []byte("order"), rowactor.WithHeaders(map[string]string{
					outbox.IDHeader: strconv.FormatInt(rec, 10), outbox.TableHeader: ob.Table().Name})); err != nil {
					t.Fatal(err)
				}
			}

			// A acks record 1; its settlement committed and is held before the hook.
			publish(a, r1)
			sa := waitFor(t, a.hook.entered, "broker A settles record 1")
			if sa.Step != "ack" || sa.Err != nil {
				t.Fatalf("A's settlement: %+v; want a committed ack", sa)
			}
			// B acks record 2 on a row with the same table name and id; its database
			// refuses the settlement.
			publish(b, r2)
			sb := waitFor(t, b.hook.entered, "broker B settles record 2")
			if sb.Step != "ack" || sb.Err == nil {
				t.Fatalf("B's settlement: %+v; want a refused ack", sb)
			}
			if sa.ID != sb.ID {
				t.Fatalf("rows %d and %d: the test needs one id on both databases", sa.ID, sb.ID)
			}

			a.hook.release()
			waitFor(t, a.hook.passed, "A's settlement passed on")
			b.hook.release()
			waitFor(t, b.hook.passed, "B's settlement passed on")

			rows := obEnv.rows(ob)
			if len(rows) != 2 || rows[0].id != r1 || rows[1].id != r2 {
				t.Fatalf("outbox rows %+v", rows)
			}
			if !rows[0].processed {
				t.Errorf("record %d, whose ack committed on A, is not stamped processed", r1)
			}
			if rows[1].processed {
				t.Errorf("record %d, whose ack B's database refused, is stamped processed: its next delivery is acked unseen", r2)
			}
		})
	}
}
