package leaserenewer_test

// The renewer's read-back of a round whose answer it never heard (readBack) keeps each
// delivery's token right, on PostgreSQL, MariaDB and SQLite.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
	"github.com/rowactor/rowactor/leaserenewer"
)

var bg = context.Background()

// server opens dialects on one database: every call of open reaches the same tables, as
// another process would.
type server struct {
	name string
	// open returns a dialect on the database of t (the same one each call in t).
	open func(t *testing.T) dialects.Dialect
	exec func(t *testing.T, d dialects.Dialect, query string)
}

func servers() []server {
	pgURL := os.Getenv("ROWACTOR_POSTGRES_URL")
	if pgURL == "" {
		pgURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	myDSN := os.Getenv("ROWACTOR_MYSQL_DSN")
	if myDSN == "" {
		myDSN = "root@tcp(127.0.0.1:3306)/test?parseTime=true"
	}
	sqlExec := func(t *testing.T, d dialects.Dialect, query string) {
		t.Helper()
		var err error
		switch d := d.(type) {
		case *mysql.Dialect:
			_, err = d.DB().ExecContext(bg, query)
		case *sqlite.Dialect:
			_, err = d.DB().ExecContext(bg, query)
		}
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}
	files := map[*testing.T]string{}
	return []server{
		{name: "postgres", open: func(t *testing.T) dialects.Dialect {
			t.Helper()
			d, err := postgres.Open(bg, pgURL)
			if err != nil {
				t.Fatalf("PostgreSQL is unreachable: %v", err)
			}
			t.Cleanup(func() { d.Close() })
			return d
		}, exec: func(t *testing.T, d dialects.Dialect, query string) {
			t.Helper()
			if _, err := d.(*postgres.Dialect).Pool().Exec(bg, query); err != nil {
				t.Fatalf("%s: %v", query, err)
			}
		}},
		{name: "mysql", open: func(t *testing.T) dialects.Dialect {
			t.Helper()
			d, err := mysql.Open(bg, myDSN)
			if err != nil {
				t.Fatalf("MariaDB is unreachable: %v", err)
			}
			t.Cleanup(func() { d.Close() })
			return d
		}, exec: sqlExec},
		{name: "sqlite", open: func(t *testing.T) dialects.Dialect {
			t.Helper()
			path, ok := files[t]
			if !ok {
				path = filepath.Join(t.TempDir(), "queue.db")
				files[t] = path
			}
			d, err := sqlite.Open(bg, path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			return d
		}, exec: sqlExec},
	}
}

// leaseTable creates a lease table on d and drops it when t ends.
func leaseTable(t *testing.T, s server, d dialects.Dialect) dialects.Table {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	tbl := dialects.Table{Name: "ra_rbk_" + hex.EncodeToString(b[:]), ID: "id", Payload: "payload",
		Attempt: "attempt", LockedUntil: "locked_until"}
	ddl, err := d.Schema(tbl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.exec(t, d, "DROP TABLE IF EXISTS "+tbl.Name) })
	for _, st := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(st) != "" {
			s.exec(t, d, st)
		}
	}
	return tbl
}

// cutAnswer is a lease queue whose next extension's answer the renewer never hears:
// run says whether the statement reached the server (and committed) first; meanwhile
// runs while the round waits for the answer (another process at work, the clock moving).
type cutAnswer struct {
	dialects.LeaseQueue
	cut       atomic.Bool
	run       bool
	meanwhile func()
}

func (q *cutAnswer) ExtendLeases(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	if !q.cut.CompareAndSwap(true, false) {
		return q.LeaseQueue.ExtendLeases(ctx, until, held)
	}
	if q.run {
		if _, err := q.LeaseQueue.ExtendLeases(ctx, until, held); err != nil {
			return nil, err
		}
	} else {
		// The statement never reached the server: the driver gives up on it at once.
		gone, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := q.LeaseQueue.ExtendLeases(gone, until, held); err == nil {
			return nil, fmt.Errorf("an extension with an ended context succeeded")
		}
	}
	if q.meanwhile != nil {
		q.meanwhile()
	}
	return nil, fmt.Errorf("extend: the answer came after the round's timeout: %w", context.DeadlineExceeded)
}

// runRound starts a renewer over q and book with clock now, asks for one round, and
// waits for it.
func runRound(t *testing.T, q dialects.LeaseQueue, book *leaserenewer.Book, lease time.Duration, now func() time.Time) {
	t.Helper()
	rounds := make(chan error, 4)
	c, stop := context.WithCancel(bg)
	t.Cleanup(stop)
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	pid := sys.Root.Spawn(leaserenewer.Props(leaserenewer.Config{
		Queue: q, Book: book, Lease: lease, Now: now, Ctx: c,
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnRound: func(_, _ int, err error) { rounds <- err },
	}))
	t.Cleanup(func() { sys.Root.Stop(pid) })
	sys.Root.Send(pid, leaserenewer.RenewNow{})
	select {
	case err := <-rounds:
		if err == nil {
			t.Fatal("the round whose answer was cut reported no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal round")
	}
}

// holds reports whether the row id holds token.
func holds(t *testing.T, q dialects.LeaseQueue, id int64, token time.Time) bool {
	t.Helper()
	found, err := q.Holding(bg, []dialects.Lease{{ID: id, Token: token}})
	if err != nil {
		t.Fatal(err)
	}
	return len(found) == 1
}

// TestReadBackConfirmsFreshLeasesBesideAnExpiredOne: one lease of a round whose old token
// already ran out must not keep the read-back from confirming the others. The round ran on the server (both
// rows moved), its answer was lost; the fresh lease's delivery must settle with the
// token its row holds.
func TestReadBackConfirmsFreshLeasesBesideAnExpiredOne(t *testing.T) {
	for _, s := range servers() {
		t.Run(s.name, func(t *testing.T) {
			d := s.open(t)
			tbl := leaseTable(t, s, d)
			a := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("a")})
			b := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("b")})
			q := &cutAnswer{LeaseQueue: dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl}), run: true}

			// Both claimed ten seconds ago with a 3 s lease: a's token ran out (the
			// renewer lagged; no other claim came for the row); b's was moved since.
			now := time.Now()
			past := leaserenewer.Expiry(now.Add(-10*time.Second), 3*time.Second)
			if rows, err := q.ClaimLeases(bg, now.Add(-10*time.Second), past, 2); err != nil || len(rows) != 2 {
				t.Fatalf("claim: %v %v", dialecttest.IDs(rows), err)
			}
			fresh := leaserenewer.Expiry(now, 3*time.Second)
			if moved, err := q.LeaseQueue.ExtendLeases(bg, fresh, []dialects.Lease{{ID: b, Token: past}}); err != nil || len(moved) != 1 {
				t.Fatalf("extend b: %v %v", moved, err)
			}
			book := leaserenewer.NewBook()
			book.Add(a, past)
			lb := book.Add(b, fresh)

			q.cut.Store(true)
			runRound(t, q, book, 10*time.Second, time.Now)

			held, lost, ok := lb.Pin()
			if lost || !ok {
				t.Fatalf("b after the round: lost %v, pinned already %v", lost, !ok)
			}
			if holds(t, q, b, fresh) {
				t.Fatal("the round did not run on the server")
			}
			if !holds(t, q, b, held.Token) {
				t.Fatalf("b's book token %v is not the one its row holds (the round moved it; claimed with %v)",
					held.Token.UTC(), fresh.UTC())
			}
		})
	}
}

// TestReadBackNeverAdoptsAnotherHostsClaim: hosts keep their clocks in step well within
// a lease, not exactly. Here another host's clock runs 200-300 ms ahead (lease 10 s): it
// claims the row with its "now" equal to the old token, in the very second our renewer
// computed its round's token from, and writes the same whole-second value. Our round's
// statement never reached the server. The read-back finds the value and our clock says
// the old token still runs; the renewer must not hand our delivery the other claim's
// token, or our settlement would settle the other host's delivery.
//
// How likely: with whole-second tokens and a round that starts before the old token ends,
// a claim with the same lease writes the round's value only when its "now" is the old
// token exactly (to its clock's resolution), so this needs a skewed clock and an exact
// coincidence. The test makes the coincidence; the bound until < old + lease rules it out
// whatever the clocks say.
func TestReadBackNeverAdoptsAnotherHostsClaim(t *testing.T) {
	const lease = 10 * time.Second
	for _, s := range servers() {
		t.Run(s.name, func(t *testing.T) {
			d := s.open(t)
			tbl := leaseTable(t, s, d)
			id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
			q := &cutAnswer{LeaseQueue: dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl})}
			other := dialecttest.OpenLease(t, s.open(t), dialects.QueueSpec{Table: tbl})

			base := time.Now().Truncate(time.Second).Add(time.Minute)
			old := base // our claim's token
			if rows, err := q.ClaimLeases(bg, old.Add(-5*time.Second), old, 1); err != nil || len(rows) != 1 {
				t.Fatalf("claim: %v %v", dialecttest.IDs(rows), err)
			}
			book := leaserenewer.NewBook()
			lh := book.Add(id, old)

			// Our clock: the round starts 300 ms before the old token ends.
			var clock atomic.Int64
			clock.Store(old.Add(-300 * time.Millisecond).UnixNano())
			now := func() time.Time { return time.Unix(0, clock.Load()) }
			var theirs time.Time
			q.meanwhile = func() {
				// The other host, 300 ms ahead, sees the old token ended and claims.
				theirNow := old
				theirs = leaserenewer.Expiry(theirNow, lease)
				if rows, err := other.ClaimLeases(bg, theirNow, theirs, 1); err != nil || len(rows) != 1 {
					t.Errorf("the other host's claim: %v %v", dialecttest.IDs(rows), err)
				}
				clock.Store(old.Add(-200 * time.Millisecond).UnixNano())
			}
			q.cut.Store(true)
			runRound(t, q, book, lease, now)
			if t.Failed() {
				return
			}

			held, lost, ok := lh.Pin()
			if !ok {
				t.Fatal("pinned already")
			}
			if !lost && held.Token.Equal(theirs) {
				// Show what it costs: our ack settles the other host's delivery.
				acked, err := q.SettleLease(bg, dialects.Step{Kind: dialects.StepAck, Now: now()}, held)
				t.Fatalf("the renewer adopted the token %v the other host's claim wrote; our ack with it: acked %v (%v), the other host's lease still held: %v",
					theirs.UTC(), acked, err, holds(t, other, id, theirs))
			}
		})
	}
}
