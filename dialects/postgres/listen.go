package postgres

import (
	"context"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/internal/pgplain"
)

// The listener's reconnect backoff: doubled after each failure from the first to the cap,
// each wait jittered into its upper half so listeners cut off together do not reconnect
// together.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// Listen calls wake with each publish's table and group, through the process's one
// listening session for its database. After that session connects, and after each
// reconnect, it calls wake("", "") so every subscription claims once: notifications sent
// while it was away are lost. It returns nil when ctx ends.
//
// The session is made from the pool's configuration, so it never takes or returns a
// pool slot. Dialects that Open made from one connection string share one session: a
// process with many brokers, or a test suite with hundreds, opens one LISTEN session per
// database instead of one per broker. A pool given to New gets a session of its own:
// its configuration may have been changed in code (a database, a dialer, a hook), and
// nothing in it tells so reliably.
func (d *Dialect) Listen(ctx context.Context, wake func(table, group string)) error {
	cfg := d.pool.Config().ConnConfig
	if !pgplain.Is(d.pool) {
		listenOn(ctx, cfg, wake)
		return nil
	}
	l, id := joinListener(cfg, wake)
	<-ctx.Done()
	l.leave(id)
	return nil
}

// listenOn holds one connection listening on Channel until ctx ends, reconnecting with
// backoff, and calls wake with what it hears.
func listenOn(ctx context.Context, cfg *pgx.ConnConfig, wake func(table, group string)) {
	backoff := listenBackoffMin
	for {
		conn, err := listenConn(ctx, cfg)
		if err == nil {
			wake("", "")
			started := time.Now()
			receive(ctx, conn, wake)
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
			_ = conn.Close(cctx)
			cancel()
			if time.Since(started) > listenBackoffMax {
				// It listened a good while: this is a new failure, not the same one.
				backoff = listenBackoffMin
			}
		}
		if ctx.Err() != nil {
			return
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// listenConn connects with the pool's configuration and listens on Channel.
func listenConn(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+quote(Channel)); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		_ = conn.Close(cctx)
		cancel()
		return nil, err
	}
	return conn, nil
}

// receive passes notifications on until the connection fails or ctx ends. A payload is
// "<table>\t<group>"; one without a tab names a table alone.
func receive(ctx context.Context, conn *pgx.Conn, wake func(table, group string)) {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		if n.Channel != Channel {
			continue
		}
		table, group, _ := strings.Cut(n.Payload, "\t")
		wake(table, group)
	}
}
