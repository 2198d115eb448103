package postgres

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
)

func TestPublish(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable(tableName(t, d))
	createTable(t, d, tbl)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	id, err := p.Publish(ctx, nil, dialects.Message{Group: "g", Payload: []byte{0, 1, 2, 'x'}, Headers: []byte(`{"a":1}`),
		NotBefore: t0})
	if err != nil {
		t.Fatal(err)
	}
	var (
		payload []byte
		group   string
		attempt int
		retry   time.Time
		htype   string
		aHeader int
	)
	err = d.Pool().QueryRow(ctx, "SELECT payload, grp, attempt, retry_after, jsonb_typeof(headers), (headers ->> 'a')::int FROM "+
		quote(tbl.Name)+" WHERE id = $1", id).Scan(&payload, &group, &attempt, &retry, &htype, &aHeader)
	if err != nil {
		t.Fatal(err)
	}
	if string(payload) != "\x00\x01\x02x" || group != "g" || attempt != 1 || !retry.Equal(micro(t0)) || htype != "object" || aHeader != 1 {
		t.Errorf("row: %q %q %d %v %s %d", payload, group, attempt, retry, htype, aHeader)
	}

	id, err = p.Publish(ctx, nil, dialects.Message{})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, d, "SELECT count(*) FROM "+quote(tbl.Name)+
		" WHERE id = $1 AND headers IS NULL AND retry_after IS NULL AND grp = '' AND length(payload) = 0", id); n != 1 {
		t.Error("an empty message was not stored with defaults")
	}
}

func TestPublishRefuses(t *testing.T) {
	d := newDialect(t)
	tbl := dialects.Table{Name: tableName(t, d), ID: "id", Payload: "payload"}
	createTable(t, d, tbl)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, nil, dialects.Message{Group: "g"}); err == nil {
		t.Error("a group was published into a table without groups")
	}
	if _, err := p.Publish(ctx, nil, dialects.Message{NotBefore: t0}); err == nil {
		t.Error("a delayed message was published into a table without retry_after")
	}
	// Headers without a headers column are dropped, as the SQLite dialect does.
	if _, err := p.Publish(ctx, nil, dialects.Message{Headers: []byte(`{}`)}); err != nil {
		t.Error(err)
	}
	if _, err := p.Publish(ctx, &sql.Tx{}, dialects.Message{}); err == nil || !strings.Contains(err.Error(), "pgx.Tx") {
		t.Errorf("a *sql.Tx was taken: %v", err)
	}
	missing := tbl
	missing.Name = tableName(t, d)
	if _, err := d.Publisher(ctx, missing); err == nil {
		t.Error("a publisher on a missing table")
	} else {
		configError(t, err)
	}
}

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
	publish(t, d, noGroup, dialects.Message{Payload: []byte("x")})
	l.table = noGroup.Name
	if got := l.next(t, 5*time.Second); got != noGroup.Name+"\t" {
		t.Fatalf("notification %q", got)
	}
}
