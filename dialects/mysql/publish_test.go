package mysql

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func TestPublish(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_pub", leaseTable)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Publish(ctx, nil, dialects.Message{Group: "g", Payload: []byte("a"), Headers: []byte(`{"traceparent": "00-x"}`),
		NotBefore: t0})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Publish(ctx, nil, dialects.Message{})
	if err != nil {
		t.Fatal(err)
	}
	if b <= a {
		t.Fatalf("ids %d then %d", a, b)
	}
	s, _ := stateOf(t, d, tbl, a)
	if s.Group != "g" || s.Attempt != 1 || s.LockedUntil != nil {
		t.Errorf("row %+v", s)
	}
	sameTime(t, "retry_after", s.RetryAfter, t0)
	var payload []byte
	var headers sql.NullString
	if err := d.DB().QueryRowContext(ctx, "SELECT payload, headers FROM "+quote(tbl.Name)+" WHERE id = ?", b).Scan(&payload, &headers); err != nil {
		t.Fatal(err)
	}
	if payload == nil || len(payload) != 0 || headers.Valid {
		t.Errorf("empty message stored payload %q headers %v", payload, headers)
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)+" WHERE JSON_EXTRACT(headers, '$.traceparent') = '00-x'"); n != 1 {
		t.Error("headers not stored as JSON")
	}
}

func TestPublishRefuses(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_pubr", func(name string) dialects.Table {
		return dialects.Table{Name: name, ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	})
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, nil, dialects.Message{Group: "g"}); err == nil {
		t.Error("a group without a group column")
	}
	if _, err := p.Publish(ctx, nil, dialects.Message{NotBefore: time.Now()}); err == nil {
		t.Error("NotBefore without a retry_after column")
	}
	// Headers without a headers column are dropped, as the SQLite dialect does.
	if _, err := p.Publish(ctx, nil, dialects.Message{Headers: []byte(`{}`)}); err != nil {
		t.Error(err)
	}
	_, err = p.Publish(ctx, "not a tx", dialects.Message{})
	if err == nil || !strings.Contains(err.Error(), "*sql.Tx") {
		t.Errorf("wrong tx type: %v", err)
	}
	missing := tbl
	missing.Headers = "headers"
	configError(t, func() error { _, err := d.Publisher(ctx, missing); return err }())
}

func TestPublishTx(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_pubtx", leaseTable)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := p.Publish(ctx, tx, dialects.Message{Payload: []byte("rolled back")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, err = d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := p.Publish(ctx, tx, dialects.Message{Payload: []byte("committed")})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := stateOf(t, d, tbl, kept); ok {
		t.Fatal("an uncommitted row is visible")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, ok := stateOf(t, d, tbl, gone); ok {
		t.Error("the rolled-back row exists")
	}
	if _, ok := stateOf(t, d, tbl, kept); !ok {
		t.Error("the committed row is missing")
	}
	var nilTx *sql.Tx
	if _, err := p.Publish(ctx, nilTx, dialects.Message{Payload: []byte("x")}); err != nil {
		t.Errorf("typed nil tx: %v", err)
	}
}
