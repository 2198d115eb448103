package postgres

import (
	"context"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The listener's reconnect backoff: doubled after each failure from the first to the cap,
// each wait jittered into its upper half so listeners cut off together do not reconnect
// together.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// Listen holds one connection listening on Channel and calls wake with each publish's
// table and group. The connection is its own (made from the pool's configuration, so it
// never takes or returns a pool slot). After it connects, and after each reconnect, it
// calls wake("", "") so every subscription claims once: notifications sent while it was
// away are lost. It returns nil when ctx ends.
func (d *Dialect) Listen(ctx context.Context, wake func(table, group string)) error {
	backoff := listenBackoffMin
	for {
		conn, err := d.listenConn(ctx)
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
			return nil
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// listenConn connects with the pool's configuration and listens on Channel.
func (d *Dialect) listenConn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, d.pool.Config().ConnConfig)
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
