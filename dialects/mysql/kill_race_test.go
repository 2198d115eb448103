package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A statement cut by its context has its server session killed (killCut, cutTx). The
// invariant: KILL only ever hits the cut statement's own session, while the broker still
// holds its connection; never a connection returned to the pool, which another user of
// the same *sql.DB may hold by then. Both tests cut statements at random moments on a
// saturated pool while other users run transactions on it, and fail when one of those
// fails.

// TestKillCutNeverHitsAPooledConnection cuts transactional lease settlements.
func TestKillCutNeverHitsAPooledConnection(t *testing.T) {
	logged := captureDriverLog(t)
	d := newDialect(t)
	tbl := newTable(t, d, "ra_killrace", leaseTable)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, Transactional: true})
	tq := q.(dialects.TxLeaseQueue)
	others := startPoolUsers(d.DB())
	cutErrs, tookEffect := 0, 0
	for i := 0; i < 600 && others.errs.Load() == 0; i++ {
		id, lease := claimOne(t, d, q, tbl, i)
		lt, err := tq.BeginDelivery(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = cutAtRandom(func(c context.Context) error {
			_, err := lt.SettleLease(c, dialects.Step{Kind: dialects.StepAck}, lease)
			return err
		})
		if err != nil {
			if cutErrs < 6 {
				t.Logf("cut settlement %d: %v", i, err)
			}
			cutErrs++
			time.Sleep(2 * time.Millisecond)
			if _, ok := stateOf(t, d, tbl, id); !ok {
				tookEffect++
				t.Logf("settlement %d reported failed but its ack took effect: %v", i, err)
			}
			_ = lt.Rollback(ctx)
		}
		time.Sleep(2 * time.Millisecond) // let a deferred KILL land
	}
	t.Logf("settlements cut: %d, of which took effect: %d", cutErrs, tookEffect)
	others.check(t, logged)
}

// TestWaitingExtensionKillNeverHitsAPooledConnection cuts lease extensions that wait for
// their rows' locks.
func TestWaitingExtensionKillNeverHitsAPooledConnection(t *testing.T) {
	logged := captureDriverLog(t)
	d := newDialect(t)
	tbl := newTable(t, d, "ra_killrace2", leaseTable)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl})
	w := q.(dialects.WaitingExtender)
	others := startPoolUsers(d.DB())
	cutErrs := 0
	for i := 0; i < 600 && others.errs.Load() == 0; i++ {
		_, lease := claimOne(t, d, q, tbl, i)
		err := cutAtRandom(func(c context.Context) error {
			_, err := w.ExtendLeasesWaiting(c, lease.Token.Add(time.Hour), []dialects.Lease{lease})
			return err
		})
		if err != nil {
			if cutErrs < 6 {
				t.Logf("cut extension %d: %v", i, err)
			}
			cutErrs++
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(2 * time.Millisecond) // let a deferred KILL land
	}
	t.Logf("extensions cut: %d", cutErrs)
	others.check(t, logged)
}

// claimOne publishes a row and claims it with the i-th token of the test: each claim's
// token is later than the one before.
func claimOne(t *testing.T, d *Dialect, q dialects.LeaseQueue, tbl dialects.Table, i int) (int64, dialects.Lease) {
	t.Helper()
	id := dialecttest.Publish(t, d, tbl, dialects.Message{Payload: []byte("p")})
	start := t0.Truncate(time.Second)
	rows, err := q.ClaimLeases(ctx, start, start.Add(time.Duration(i+1)*time.Second), 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	return id, dialects.Lease{ID: id, Token: rows[0].Token}
}

// cutAtRandom runs f with a context that ends within 1.5 ms.
func cutAtRandom(f func(context.Context) error) error {
	c, cancel := context.WithCancel(ctx)
	defer cancel()
	tm := time.AfterFunc(time.Duration(rand.Intn(1500))*time.Microsecond, cancel)
	defer tm.Stop()
	return f(c)
}

// poolUsers are other users of the broker's pool, each running short transactions.
type poolUsers struct {
	stop  chan struct{}
	wg    sync.WaitGroup
	errs  atomic.Int64
	first atomic.Value
}

// startPoolUsers saturates db (4 connections, 6 users): a returned connection goes
// straight to a waiter (database/sql's putConn), so a KILL sent after a connection went
// back lands on another user's transaction.
func startPoolUsers(db *sql.DB) *poolUsers {
	db.SetMaxOpenConns(4)
	u := &poolUsers{stop: make(chan struct{})}
	for range 6 {
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			for {
				select {
				case <-u.stop:
					return
				default:
				}
				if err := u.transaction(db); err != nil {
					u.errs.Add(1)
					u.first.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	return u
}

func (u *poolUsers) transaction(db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err = tx.ExecContext(ctx, "DO SLEEP(0.0005)"); err == nil {
		_, err = tx.ExecContext(ctx, "SELECT 1")
	}
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// check stops the users and fails t if a transaction of theirs failed. A cut statement's
// own connection, killed while the broker still holds it, is found dead by its rollback
// (the driver logs it, counted by logged) and discarded: only another user's failure
// counts.
func (u *poolUsers) check(t *testing.T, logged *driverLog) {
	t.Helper()
	close(u.stop)
	u.wg.Wait()
	t.Logf("connections the driver found dead: %d (first: %v)", logged.n.Load(), logged.first.Load())
	if n := u.errs.Load(); n > 0 {
		t.Fatalf("%d transactions of another user of the pool failed (first: %v): a KILL hit a connection returned to the pool", n, u.first.Load())
	}
}

// driverLog counts the lines the MySQL driver logs, and keeps the first.
type driverLog struct {
	n     atomic.Int64
	first atomic.Value
}

// captureDriverLog sends the driver's log to a driverLog until the test ends.
func captureDriverLog(t *testing.T) *driverLog {
	l := &driverLog{}
	_ = mysql.SetLogger(logFunc(func(v ...any) {
		l.n.Add(1)
		l.first.CompareAndSwap(nil, strings.TrimSpace(fmt.Sprint(v...)))
	}))
	t.Cleanup(func() { _ = mysql.SetLogger(log.New(os.Stderr, "[mysql] ", log.Ldate|log.Ltime|log.Lshortfile)) })
	return l
}

type logFunc func(v ...any)

func (f logFunc) Print(v ...any) { f(v...) }
