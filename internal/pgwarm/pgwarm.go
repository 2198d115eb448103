// Package pgwarm keeps PostgreSQL pools warm between tests, for the module's test suites
// only.
//
// A new PostgreSQL session costs the CI machine about 40 ms of CPU (a fork of the
// postmaster, a cold catalog cache, and its exit): 300 sequential connections took 12
// CPU-seconds. Each conformance cell opened three to six sessions, and the PostgreSQL
// cells spent more CPU in the server than in the test binary. So a test's pool is one
// another test, already over, used: the test has it to itself, its budget is a fresh
// pool's (dialects.ForgetBudget), and what a session could carry over is reset before
// it is handed on (settings, session advisory locks, LISTEN), while a connection that is
// gone (a test killed its session) is dropped.
package pgwarm

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/pgplain"
)

const (
	// poolsKept bounds the pools kept between tests (all URLs together), and connsKept
	// the idle sessions each keeps: they count against the server's max_connections
	// (100 on the test server) beside those of the tests running. Eight pools of four
	// reached 83 connections in the root package's PostgreSQL cells.
	poolsKept = 6
	connsKept = 2
)

var warm struct {
	sync.Mutex
	free map[string][]*pgxpool.Pool // by URL
	n    int
}

var urls sync.Map // *pgxpool.Pool → URL it was opened on

// Take returns a warm pool opened on url, or a new one (pinged).
func Take(ctx context.Context, url string) (*pgxpool.Pool, error) {
	warm.Lock()
	if ps := warm.free[url]; len(ps) > 0 {
		p := ps[len(ps)-1]
		warm.free[url] = ps[:len(ps)-1]
		warm.n--
		warm.Unlock()
		return p, nil
	}
	warm.Unlock()
	p, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	pgplain.Mark(p) // made from url alone: its dialects share a LISTEN session
	urls.Store(p, url)
	return p, nil
}

// Give takes a test's pool back once the test is over. Every connection must have been
// released: one still acquired 15 s after the test is a claim or session the test left
// open, and fails it (as closing the pool, which would wait for it, did).
func Give(t testing.TB, p *pgxpool.Pool) {
	for deadline := time.Now().Add(15 * time.Second); p.Stat().AcquiredConns() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("postgres: the pool still had %d connections acquired 15 s after the test (a row lock claim or an advisory session left open)", p.Stat().AcquiredConns())
			urls.Delete(p)
			pgplain.Forget(p)
			go p.Close()
			return
		}
	}
	dialects.ForgetBudget(p)
	u, known := urls.Load(p)
	if !known || resetIdle(p) != nil {
		urls.Delete(p)
		pgplain.Forget(p)
		p.Close()
		return
	}
	warm.Lock()
	if warm.n < poolsKept {
		if warm.free == nil {
			warm.free = make(map[string][]*pgxpool.Pool)
		}
		warm.free[u.(string)] = append(warm.free[u.(string)], p)
		warm.n++
		p = nil
	}
	warm.Unlock()
	if p != nil {
		urls.Delete(p)
		pgplain.Forget(p)
		p.Close() // nothing is acquired: it does not wait
	}
}

// CloseAll closes the pools kept, once every test is over (before a goroutine-leak
// check: each pool runs a health check goroutine).
func CloseAll() {
	warm.Lock()
	free := warm.free
	warm.free, warm.n = nil, 0
	warm.Unlock()
	for _, ps := range free {
		for _, p := range ps {
			urls.Delete(p)
			pgplain.Forget(p)
			p.Close()
		}
	}
}

// resetIdle resets the pool's idle sessions to a new session's state, keeps connsKept of
// them and closes the others and any that fails.
func resetIdle(p *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kept := 0
	for _, c := range p.AcquireAllIdle(ctx) {
		if kept >= connsKept {
			_ = c.Hijack().Close(ctx)
			continue
		}
		if _, err := c.Exec(ctx, "RESET ALL; SELECT pg_advisory_unlock_all(); UNLISTEN *"); err != nil {
			_ = c.Hijack().Close(ctx)
			continue
		}
		kept++
		c.Release()
	}
	if kept == 0 && p.Stat().TotalConns() > 0 {
		return fmt.Errorf("postgres: no idle session of the pool could be reset")
	}
	return nil
}
