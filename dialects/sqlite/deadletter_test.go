package sqlite

import (
	"fmt"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// TestCatalogColumns: the catalog tells a column an INSERT must give a value (NOT NULL
// without a default, not generated, not the rowid) and a column it cannot write (a
// virtual or stored generated column).
func TestCatalogColumns(t *testing.T) {
	d := newDialect(t)
	mustExec(t, d, `CREATE TABLE jobs (
		id INTEGER PRIMARY KEY NOT NULL,
		customer TEXT NOT NULL,
		Mixed TEXT NOT NULL DEFAULT '',
		amount NUMERIC,
		customer_key TEXT GENERATED ALWAYS AS (lower(customer)) VIRTUAL,
		customer_len INTEGER GENERATED ALWAYS AS (length(customer)) STORED)`)
	mustExec(t, d, `CREATE TABLE keyed (code TEXT PRIMARY KEY NOT NULL, n INTEGER)`)
	for table, want := range map[string]string{
		"jobs":  "[{id false false} {customer true false} {Mixed false false} {amount false false} {customer_key false true} {customer_len false true}]",
		"keyed": "[{code true false} {n false false}]",
		"none":  "[]",
	} {
		t.Run(table, func(t *testing.T) { dialecttest.CatalogColumns(t, d.catalogOf, table, want) })
	}
}

// TestCulprit: the column or constraint an SQLite error names.
func TestCulprit(t *testing.T) {
	d := newDialect(t)
	mustExec(t, d, `CREATE TABLE dead (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, n INTEGER,
		CONSTRAINT dead_refuses CHECK (n IS NULL OR n > 0))`)
	mustExec(t, d, `CREATE TRIGGER dead_closed BEFORE INSERT ON dead WHEN NEW.n = 42 BEGIN SELECT RAISE(ABORT, 'dead letters are closed'); END`)
	for _, c := range []struct {
		insert string
		want   dialects.Culprit
	}{
		{"INSERT INTO dead (customer) VALUES (NULL)", dialects.Culprit{Table: "dead", Column: "customer"}},
		{"INSERT INTO dead (customer, n) VALUES ('a', -1)", dialects.Culprit{Constraint: "dead_refuses"}},
		{"INSERT INTO dead (id, customer) VALUES (1, 'a'), (1, 'b')", dialects.Culprit{Table: "dead", Column: "id"}},
		{"INSERT INTO dead (customer, n) VALUES ('a', 42)", dialects.Culprit{}},
	} {
		_, err := d.DB().ExecContext(ctx, c.insert)
		if err == nil {
			t.Fatalf("%s: no error", c.insert)
		}
		if got := d.Culprit(fmt.Errorf("settle: %w", err)); got != c.want {
			t.Errorf("%s (%v): %+v, want %+v", c.insert, err, got, c.want)
		}
	}
}
