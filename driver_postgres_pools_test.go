package rowactor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
)

// Warm pools. A new PostgreSQL session costs this machine about 40 ms of CPU (a fork of
// the postmaster, a cold catalog cache, and its exit): measured with 300 sequential
// connections, 12 CPU-seconds. Each conformance cell opened three to six sessions, and
// the PostgreSQL cells spent more CPU in the server than in the test binary. So a test's
// dialect runs on a pool another test, already over, used: it has the test to itself,
// its size and budget are a fresh pool's, and what a session could carry over is reset
// before it is handed on (settings, session advisory locks, LISTEN), while a connection
// that is gone (a test killed its session) is dropped.
var warmPools struct {
	sync.Mutex
	free []*pgxpool.Pool
}

const (
	// warmPoolsKept bounds the pools kept between tests, and warmConnsKept the idle
	// sessions each keeps: their sessions count against the server's max_connections
	// (100 on the test server) beside those of the tests running.
	warmPoolsKept = 6
	warmConnsKept = 2
)

// takePool returns a warm pool on url, or a new one.
func takePool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	warmPools.Lock()
	if n := len(warmPools.free); n > 0 {
		p := warmPools.free[n-1]
		warmPools.free = warmPools.free[:n-1]
		warmPools.Unlock()
		return p, nil
	}
	warmPools.Unlock()
	p, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// givePool takes a test's pool back once the test is over. Every connection must have
// been released: one still acquired 15 s after the test is a claim or session the test
// left open, reported as closing an owned pool reported it.
func givePool(t *testing.T, p *pgxpool.Pool) {
	for deadline := time.Now().Add(15 * time.Second); p.Stat().AcquiredConns() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("postgres: the pool still had %d connections acquired 15 s after the test (a row lock claim or an advisory session left open)", p.Stat().AcquiredConns())
			go p.Close()
			return
		}
	}
	dialects.ForgetBudget(p)
	if err := resetIdle(p); err != nil {
		p.Close()
		return
	}
	warmPools.Lock()
	if len(warmPools.free) < warmPoolsKept {
		warmPools.free = append(warmPools.free, p)
		p = nil
	}
	warmPools.Unlock()
	if p != nil {
		p.Close() // nothing is acquired: it does not wait
	}
}

// resetIdle resets the pool's idle sessions to a new session's state, keeps
// warmConnsKept of them and closes the others and any that fails.
func resetIdle(p *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kept := 0
	for _, c := range p.AcquireAllIdle(ctx) {
		if kept >= warmConnsKept {
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

// closeWarmPools closes the pools kept once every test is over.
func closeWarmPools() {
	warmPools.Lock()
	free := warmPools.free
	warmPools.free = nil
	warmPools.Unlock()
	for _, p := range free {
		p.Close()
	}
}
