package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// listener is a raw LISTEN connection collecting this test's notifications (other
// processes may publish into other tables meanwhile).
type listener struct {
	conn  *pgx.Conn
	table string
}

func listen(t *testing.T, table string) *listener {
	t.Helper()
	conn, err := pgx.Connect(ctx, testURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		t.Fatal(err)
	}
	return &listener{conn: conn, table: table}
}

// next returns the next payload for the listener's table, or "" after wait.
func (l *listener) next(t *testing.T, wait time.Duration) string {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		n, err := l.conn.WaitForNotification(wctx)
		if errors.Is(err, context.DeadlineExceeded) || wctx.Err() != nil {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(n.Payload, l.table+"\t") {
			return n.Payload
		}
	}
}

func TestPublishTxNotifiesAtCommit(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	l := listen(t, tbl.Name)

	tx, err := d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := p.Publish(ctx, tx, dialects.Message{Group: "g", Payload: []byte("rolled back")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := l.next(t, 200*time.Millisecond); got != "" {
		t.Fatalf("a rolled back publish notified %q", got)
	}
	if _, exists := stateOf(t, d, tbl, gone); exists {
		t.Fatal("the rolled back row exists")
	}

	tx, err = d.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := p.Publish(ctx, tx, dialects.Message{Group: "g", Payload: []byte("committed")})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.next(t, 200*time.Millisecond); got != "" {
		t.Fatalf("an uncommitted publish notified %q", got)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := l.next(t, 5*time.Second); got != tbl.Name+"\tg" {
		t.Fatalf("notification %q", got)
	}
	if _, exists := stateOf(t, d, tbl, kept); !exists {
		t.Fatal("the committed row is missing")
	}

	// Through the pool, the notification follows the autocommit.
	noGroup := dialects.Table{Name: tableName(t, d), ID: "id", Payload: "payload"}
	createTable(t, d, noGroup)
	dialecttest.Publish(t, d, noGroup, dialects.Message{Payload: []byte("x")})
	l.table = noGroup.Name
	if got := l.next(t, 5*time.Second); got != noGroup.Name+"\t" {
		t.Fatalf("notification %q", got)
	}
}
