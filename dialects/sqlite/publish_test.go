package sqlite

import (
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func TestPublish(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	createTable(t, d, tbl)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	id, err := p.Publish(ctx, nil, dialects.Message{Group: "g", Payload: []byte("x"), Headers: []byte(`{"a":1}`),
		NotBefore: t0})
	if err != nil {
		t.Fatal(err)
	}
	var (
		payload  []byte
		group    string
		attempt  int
		retry    string
		htype    string
		ptype    string
		aHeader  int
		noHeader int
	)
	err = d.DB().QueryRowContext(ctx, "SELECT payload, typeof(payload), grp, attempt, retry_after, typeof(headers), headers ->> '$.a' FROM jobs WHERE id = ?", id).
		Scan(&payload, &ptype, &group, &attempt, &retry, &htype, &aHeader)
	if err != nil {
		t.Fatal(err)
	}
	if string(payload) != "x" || ptype != "blob" || group != "g" || attempt != 1 || retry != formatTime(t0) || htype != "text" || aHeader != 1 {
		t.Errorf("row: %q %s %q %d %q %s %d", payload, ptype, group, attempt, retry, htype, aHeader)
	}

	id, err = p.Publish(ctx, nil, dialects.Message{})
	if err != nil {
		t.Fatal(err)
	}
	noHeader = count(t, d, "SELECT count(*) FROM jobs WHERE id = ? AND headers IS NULL AND retry_after IS NULL AND grp = '' AND length(payload) = 0", id)
	if noHeader != 1 {
		t.Error("an empty message was not stored with defaults")
	}
}

func TestPublishTx(t *testing.T) {
	d := newDialect(t)
	tbl := leaseTable("jobs")
	createTable(t, d, tbl)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}

	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, tx, dialects.Message{Payload: []byte("gone")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, d, "SELECT count(*) FROM jobs"); n != 0 {
		t.Fatalf("a rolled-back publish left %d rows", n)
	}

	tx, err = d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := p.Publish(ctx, tx, dialects.Message{Payload: []byte("kept")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, d, "SELECT count(*) FROM jobs WHERE id = ?", id); n != 1 {
		t.Fatal("a committed publish left no row")
	}

	_, err = p.Publish(ctx, d.DB(), dialects.Message{Payload: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), "needs a *sql.Tx, got *sql.DB") {
		t.Errorf("wrong tx type: %v", err)
	}
}

func TestPublishRefuses(t *testing.T) {
	d := newDialect(t)
	mustExec(t, d, "CREATE TABLE plain (id INTEGER PRIMARY KEY, payload BLOB NOT NULL, headers TEXT NOT NULL DEFAULT '{}')")
	tbl := dialects.Table{Name: "plain", ID: "id", Payload: "payload", Headers: "headers"}
	// Publishing needs no claim form, so the row lock refusal does not apply.
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, nil, dialects.Message{Payload: []byte("x"), NotBefore: t0.Add(time.Hour)}); err == nil {
		t.Error("NotBefore without a retry_after column was accepted")
	}
	if _, err := p.Publish(ctx, nil, dialects.Message{Payload: []byte("x"), Group: "g"}); err == nil {
		t.Error("Group without a group column was accepted")
	}
	// Without headers the column keeps its default.
	id, err := p.Publish(ctx, nil, dialects.Message{Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if count(t, d, "SELECT count(*) FROM plain WHERE id = ? AND headers = '{}'", id) != 1 {
		t.Error("headers default not kept")
	}

	tbl.Attempt = "tries"
	_, err = d.Publisher(ctx, tbl)
	if ce := configError(t, err); ce.Column != "tries" {
		t.Errorf("missing column named %q", ce.Column)
	}
}
