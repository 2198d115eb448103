package dialecttest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// publishScenarios are publishers (Dialect.Publisher, Publisher.Publish).
var publishScenarios = []scenario{
	{name: "Publish", run: testPublish},
	{name: "PublishRefuses", run: testPublishRefuses},
	{name: "PublishTx", run: testPublishTx},
}

func testPublish(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_pub", leaseTable)
	p, err := e.d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Publish(ctx, nil, dialects.Message{Group: "g", Payload: []byte{0, 1, 2, 'x'},
		Headers: []byte(`{"a":1,"traceparent":"00-x"}`), NotBefore: t0})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := e.state(tbl, a)
	if s.Group != "g" || s.Attempt != 1 || s.LockedUntil != nil || s.ProcessedAt != nil {
		t.Errorf("row %+v", s)
	}
	sameTime(t, "retry_after", s.RetryAfter, t0)
	var payload, headers []byte
	if !h.QueryRow(t, e.d, "SELECT payload, headers FROM "+e.q(tbl.Name)+" WHERE id = ?", []any{a}, &payload, &headers) {
		t.Fatal("no row")
	}
	var hdr map[string]any
	if err := json.Unmarshal(headers, &hdr); err != nil || hdr["a"] != 1.0 || hdr["traceparent"] != "00-x" {
		t.Errorf("headers %q: %v", headers, err)
	}
	if string(payload) != "\x00\x01\x02x" {
		t.Errorf("payload %q", payload)
	}
	if c, ok := h.(PublishChecker); ok {
		c.CheckPublished(t, e.d, tbl, a)
	}

	b, err := p.Publish(ctx, nil, dialects.Message{})
	if err != nil {
		t.Fatal(err)
	}
	if b <= a {
		t.Fatalf("ids %d then %d", a, b)
	}
	if n := e.count("SELECT COUNT(*) FROM "+e.q(tbl.Name)+
		" WHERE id = ? AND headers IS NULL AND retry_after IS NULL AND grp = '' AND payload IS NOT NULL AND length(payload) = 0", b); n != 1 {
		t.Error("an empty message was not stored with defaults")
	}
}

func testPublishRefuses(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_pubr", func(name string) dialects.Table {
		return dialects.Table{Name: name, ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	})
	p, err := e.d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, nil, dialects.Message{Group: "g"}); err == nil {
		t.Error("a group was published into a table without groups")
	}
	if _, err := p.Publish(ctx, nil, dialects.Message{NotBefore: t0.Add(time.Hour)}); err == nil {
		t.Error("a delayed message was published into a table without retry_after")
	}
	// Headers without a headers column are dropped.
	if _, err := p.Publish(ctx, nil, dialects.Message{Headers: []byte(`{}`)}); err != nil {
		t.Error(err)
	}
	for _, wrong := range []any{"not a tx", e.caps.WrongTx} {
		_, err = p.Publish(ctx, wrong, dialects.Message{})
		if want := fmt.Sprintf("needs a %s, got %T", e.caps.TxType, wrong); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("tx of the wrong type %T: %v, want an error saying %q", wrong, err, want)
		}
	}
	if e.count("SELECT COUNT(*) FROM "+e.q(tbl.Name)) != 1 {
		t.Error("refused publishes wrote rows")
	}

	// Publishing needs no claim form; a table's own default for headers is kept.
	ty := e.caps.Types
	plain := dialects.Table{Name: e.name("ra_pubd"), ID: "id", Payload: "payload", Headers: "headers"}
	e.exec("CREATE TABLE " + e.q(plain.Name) + " (id " + ty.ID + ", payload " + ty.Blob + " NOT NULL, headers " + ty.JSON + " NOT NULL DEFAULT '{}')")
	p, err = e.d.Publisher(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	id, err := p.Publish(ctx, nil, dialects.Message{Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	var headers []byte
	var hdr map[string]any
	if !h.QueryRow(t, e.d, "SELECT headers FROM "+e.q(plain.Name)+" WHERE id = ?", []any{id}, &headers) ||
		json.Unmarshal(headers, &hdr) != nil || len(hdr) != 0 {
		t.Errorf("headers default not kept: %q", headers)
	}

	// A column the table lacks, or a table that is not there, is refused.
	missing := tbl
	missing.Headers = "headers"
	configError(t, func() error { _, err := e.d.Publisher(ctx, missing); return err }())
	plain.Attempt = "tries"
	_, err = e.d.Publisher(ctx, plain)
	if ce := configError(t, err); ce.Column != "tries" {
		t.Errorf("missing column named %q", ce.Column)
	}
	gone := tbl
	gone.Name = e.name("ra_none")
	configError(t, func() error { _, err := e.d.Publisher(ctx, gone); return err }())
}

// A publish in a caller's transaction exists only once it commits.
func testPublishTx(t *testing.T, h Harness) {
	e := setup(t, h)
	tbl := e.table("ra_pubtx", leaseTable)
	p, err := e.d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	tx := h.Begin(t, e.d)
	gone, err := p.Publish(ctx, tx.Value(), dialects.Message{Payload: []byte("rolled back")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := e.count("SELECT COUNT(*) FROM " + e.q(tbl.Name)); n != 0 {
		t.Fatalf("a rolled-back publish left %d rows", n)
	}
	tx = h.Begin(t, e.d)
	kept, err := p.Publish(ctx, tx.Value(), dialects.Message{Payload: []byte("committed")})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.state(tbl, kept); ok {
		t.Fatal("an uncommitted row is visible")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// (A database may hand the rolled-back row's id out again.)
	if _, ok := e.state(tbl, gone); ok && gone != kept {
		t.Error("the rolled-back row exists")
	}
	if n := e.count("SELECT COUNT(*) FROM " + e.q(tbl.Name)); n != 1 {
		t.Errorf("%d rows after one commit, want 1", n)
	}
	if _, ok := e.state(tbl, kept); !ok {
		t.Error("the committed row is missing")
	}
	if nilTx := e.caps.TypedNilTx; nilTx != nil {
		id, err := p.Publish(ctx, nilTx, dialects.Message{Payload: []byte("x")})
		if err != nil {
			t.Fatalf("typed nil tx: %v", err)
		}
		if _, ok := e.state(tbl, id); !ok {
			t.Error("a publish with a typed nil tx left no row")
		}
	}
}
