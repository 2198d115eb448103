package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// FuzzQuote: any identifier is quoted between backticks with every backtick inside
// doubled, so the quoted form has no lone backtick and unquotes to the identifier: a name
// with quotes, backticks, semicolons or unicode cannot end the identifier early. Literals
// (advisory key text) are likewise single-quoted with doubled single quotes.
func FuzzQuote(f *testing.F) {
	f.Add("jobs")
	f.Add("a`b")
	f.Add(`a"b;--`)
	f.Fuzz(func(t *testing.T, name string) {
		dialecttest.CheckQuoting(t, name, dialecttest.Quoting{Quote: quote, Mark: '`', Literal: literal,
			Unliteral: func(l string) (string, bool) { return dialecttest.Unquote(l, '\'') }})
	})
}

// FuzzLeaseRoundTrip creates a table whose name, payload column and payload are the
// fuzzed identifier (written with SQLite's double quotes, not the dialect's backticks),
// describes it, opens a lease queue on it, publishes a row, claims it and acks it. SQLite
// refusing the CREATE TABLE (a reserved name, a NUL byte, a duplicate column) skips the
// input; a table SQLite made must then work end to end, or be refused by the description
// check with a *ConfigError. Whatever happens, the sentinel table beside it keeps its row
// and no other table appears or goes.
func FuzzLeaseRoundTrip(f *testing.F) {
	f.Add("jobs")
	f.Add("x`); DROP TABLE zz_sentinel; --")
	f.Add("表 naïve 🚀")
	ctx := context.Background()
	owner, err := Open(ctx, filepath.Join(f.TempDir(), "fuzz.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { owner.Close() })
	db := owner.DB()
	for _, s := range []string{
		// AUTOINCREMENT makes sqlite_sequence now, so the fuzzed tables' own never shows as
		// a new table.
		`CREATE TABLE zz_sentinel (id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT NOT NULL)`,
		`INSERT INTO zz_sentinel (id, v) VALUES (1, 'keep me')`,
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			f.Fatal(err)
		}
	}
	tables := func(t *testing.T) string { return fuzzTables(ctx, t, db) }
	dq := fuzzQuote

	f.Fuzz(func(t *testing.T, ident string) {
		if strings.IndexByte(ident, 0) >= 0 {
			t.Skip("SQLite reads SQL text up to a NUL byte")
		}
		before := tables(t)
		group := ident + "#g"
		ddl := "CREATE TABLE " + dq(ident) + " (id INTEGER PRIMARY KEY AUTOINCREMENT, " + dq(ident) + " BLOB NOT NULL, " +
			dq(group) + " TEXT NOT NULL DEFAULT '', attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT)"
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			if tables(t) != before {
				t.Fatalf("a refused CREATE TABLE changed the schema")
			}
			t.Skipf("SQLite refuses the name: %v", err)
		}
		defer fuzzDropAndCheck(ctx, t, db, ident, before)
		fuzzRoundTrip(ctx, t, db, ident, group)
	})
}

// fuzzTables lists the database's tables, NUL-separated.
func fuzzTables(ctx context.Context, t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.QueryContext(ctx, "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, "\x00")
}

// fuzzQuote quotes an identifier with SQLite's double quotes.
func fuzzQuote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// fuzzDropAndCheck drops the fuzzed table, and checks that the tables are those before
// it and that the sentinel table keeps its row.
func fuzzDropAndCheck(ctx context.Context, t *testing.T, db *sql.DB, ident, before string) {
	if _, err := db.ExecContext(ctx, "DROP TABLE "+fuzzQuote(ident)); err != nil {
		t.Errorf("drop %q: %v", ident, err)
	}
	if after := fuzzTables(ctx, t, db); after != before {
		t.Errorf("tables before %q, after %q", before, after)
	}
	var v string
	if err := db.QueryRowContext(ctx, "SELECT group_concat(id || '=' || v) FROM zz_sentinel").Scan(&v); err != nil || v != "1=keep me" {
		t.Errorf("the sentinel table changed: %q %v", v, err)
	}
}

// fuzzRoundTrip describes the fuzzed table, opens a lease queue on it, publishes a row,
// claims it and acks it; a description refused with a *ConfigError ends it early.
func fuzzRoundTrip(ctx context.Context, t *testing.T, db *sql.DB, ident, group string) {
	dq := fuzzQuote
	d := New(db) // a Dialect of its own, so no prepared statement outlives the table
	defer d.Close()
	tbl := dialects.Table{Name: ident, ID: "id", Payload: ident, Group: group, Attempt: "attempt", LockedUntil: "locked_until"}
	spec := dialects.QueueSpec{Table: tbl, Group: "g'`\";--"}
	q, err := d.Open(ctx, spec)
	if err != nil {
		var ce *dialects.ConfigError
		if errors.As(err, &ce) && dialects.CheckDescription(tbl) != nil {
			return // refused before any SQL names it (a dot in the name)
		}
		t.Fatalf("Open on table %q that SQLite created: %v", ident, err)
	}
	defer q.Close()
	lq, ok := q.(dialects.LeaseQueue)
	if !ok {
		t.Fatalf("Open returned %T, not a LeaseQueue", q)
	}
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatalf("Publisher on table %q: %v", ident, err)
	}
	id, err := p.Publish(ctx, nil, dialects.Message{Group: spec.Group, Payload: []byte(ident)})
	if err != nil {
		t.Fatalf("Publish into %q: %v", ident, err)
	}
	now := time.Now()
	rows, err := lq.ClaimLeases(ctx, now, now.Add(time.Minute), 10)
	if err != nil {
		t.Fatalf("claim from %q: %v", ident, err)
	}
	if len(rows) != 1 || rows[0].ID != id || !bytes.Equal(rows[0].Payload, []byte(ident)) || rows[0].Attempt != 1 {
		t.Fatalf("claim from %q: got %+v, want row %d with payload %q at attempt 1", ident, rows, id, ident)
	}
	settled, err := lq.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: now}, dialects.Lease{ID: id, Token: rows[0].Token})
	if err != nil || !settled {
		t.Fatalf("ack in %q: %v %v", ident, settled, err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+dq(ident)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("table %q after the ack holds %d rows (%v)", ident, n, err)
	}
}
