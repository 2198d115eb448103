package postgres

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// syncHolder holds back, once armed, the Sync that ends a pipeline of two or more
// Executes until release closes: the server has run the pipeline's statements and waits
// to read the Sync.
type syncHolder struct {
	net.Conn
	armed   *atomic.Bool
	held    chan struct{} // closed once a Sync is held
	release chan struct{}
}

func (s syncHolder) Write(b []byte) (int, error) {
	const sync = "S\x00\x00\x00\x04"
	if !s.armed.Load() || len(b) < 5 || string(b[len(b)-5:]) != sync {
		return s.Conn.Write(b)
	}
	execs := 0
	for i := 0; i+5 <= len(b); {
		if b[i] == 'E' {
			execs++
		}
		i += 1 + (int(b[i+1])<<24 | int(b[i+2])<<16 | int(b[i+3])<<8 | int(b[i+4]))
	}
	if execs < 2 {
		return s.Conn.Write(b)
	}
	s.armed.Store(false)
	n, err := s.Conn.Write(b[:len(b)-5])
	if err != nil {
		return n, err
	}
	close(s.held)
	<-s.release
	m, err := s.Conn.Write(b[len(b)-5:])
	return n + m, err
}

// A settlement the server committed, and answered, is reported settled though the
// session is ended before the server reads the pipeline's Sync (the server then sends
// FATAL after COMMIT's answer). The connection is not returned to the pool.
func TestASettlementTheServerCommittedIsReportedSettledThoughItsSessionThenEnds(t *testing.T) {
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec"} {
		t.Run(mode, func(t *testing.T) {
			var armed atomic.Bool
			held, release := make(chan struct{}), make(chan struct{})
			pc, err := pgxpool.ParseConfig(withParams(testURL(), "pool_max_conns=1", "default_query_exec_mode="+mode))
			if err != nil {
				t.Fatal(err)
			}
			pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return syncHolder{Conn: c, armed: &armed, held: held, release: release}, nil
			}
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			if err != nil {
				t.Fatal(err)
			}
			d := New(pool)
			t.Cleanup(func() { d.Close(); pool.Close() })
			obs := newDialect(t)
			tbl := rowLockTable(tableName(t, obs))
			createTable(t, obs, tbl)
			id := dialecttest.Publish(t, obs, tbl, dialects.Message{Payload: []byte("p")})
			q := dialecttest.OpenRowLock(t, d, dialects.QueueSpec{Table: tbl})
			// A first settlement prepares the statements.
			c, _ := claimLocked(t, q, t0)
			if err := c.Settle(ctx, dialects.Step{Kind: dialects.StepRetry, Now: t0}); err != nil {
				t.Fatal(err)
			}
			c, _ = claimLocked(t, q, t0)
			pid := c.(*lockedClaim).conn.Conn().PgConn().PID()
			armed.Store(true)
			done := make(chan error, 1)
			go func() { done <- c.Settle(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}) }()
			<-held
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if _, ok := stateOf(t, obs, tbl, id); !ok {
					break // committed: another session sees the row gone
				}
				if time.Now().After(deadline) {
					t.Fatal("the ack never committed")
				}
			}
			mustExec(t, obs, "SELECT pg_terminate_backend($1)", int(pid))
			waitGone(t, obs, int(pid))
			close(release)
			if err := <-done; err != nil {
				t.Errorf("an ack the server committed and answered was reported failed: %v", err)
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Errorf("%d connections held", n)
			}
			if n := pool.Stat().IdleConns(); n != 0 {
				t.Errorf("the ended session's connection went back to the pool (%d idle)", n)
			}
		})
	}
}
