package adminsql

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// TestMoveColumns: a move copies every column the two tables share by name, in the queue
// table's order, leaving out what the destination computes; it refuses a pair of tables
// that cannot keep a row whole.
func TestMoveColumns(t *testing.T) {
	tb := dialects.Table{Name: "jobs", ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	col := func(name string) CatalogColumn { return CatalogColumn{Name: name} }
	req := func(name string) CatalogColumn { return CatalogColumn{Name: name, Required: true} }
	gen := func(name string) CatalogColumn { return CatalogColumn{Name: name, Generated: true} }
	queue := []CatalogColumn{col("id"), req("payload"), col("attempt"), col("locked_until"), req("customer"), col("amount"), gen("customer_key")}
	names := func(cols []MoveColumn, requeue bool) string {
		var out []string
		for _, c := range cols {
			from, to := c.Name, c.DeadName
			if requeue {
				from, to = c.DeadName, c.Name
			}
			s := from
			if to != from {
				s += ">" + to
			}
			if c.Role != "" {
				s += ":" + c.Role
			}
			out = append(out, s)
		}
		return strings.Join(out, " ")
	}
	for _, c := range []struct {
		name    string
		queue   []CatalogColumn
		dead    []CatalogColumn
		fold    bool
		requeue bool
		want    string // the columns, or the refusal's text
		column  string // the refusal's column
	}{
		{name: "every shared column, the service's own too, in the queue table's order",
			queue: queue, dead: []CatalogColumn{col("amount"), col("customer_key"), col("customer"), col("payload"), col("id"), col("attempt"), col("locked_until"), col("dead_at")},
			want: "id:ID payload:Payload attempt:Attempt locked_until:LockedUntil customer amount customer_key"},
		{name: "names fold where the database folds them", fold: true,
			queue: queue, dead: []CatalogColumn{col("ID"), col("Payload"), col("attempt"), col("locked_until"), col("CUSTOMER"), col("Amount"), col("customer_key")},
			want: "id>ID:ID payload>Payload:Payload attempt:Attempt locked_until:LockedUntil customer>CUSTOMER amount>Amount customer_key"},
		{name: "names keep their case where the database keeps it",
			queue: queue, dead: []CatalogColumn{col("id"), col("payload"), col("attempt"), col("locked_until"), col("CUSTOMER")},
			want: `column "customer" is NOT NULL without a default in the queue table`, column: "customer"},
		{name: "a column the dead-letter table computes is left to it",
			queue: queue, dead: []CatalogColumn{col("id"), col("payload"), col("attempt"), col("locked_until"), col("customer"), gen("customer_key")},
			want: "id:ID payload:Payload attempt:Attempt locked_until:LockedUntil customer"},
		{name: "a requeue leaves out what the queue table computes", requeue: true,
			queue: queue, dead: []CatalogColumn{col("id"), col("payload"), col("attempt"), col("locked_until"), col("customer"), col("customer_key")},
			want: "id:ID payload:Payload attempt:Attempt locked_until:LockedUntil customer"},
		{name: "a NOT NULL column without a default only the dead-letter table has",
			queue: queue, dead: []CatalogColumn{col("id"), col("payload"), col("attempt"), col("locked_until"), col("customer"), req("approver")},
			want: `column "approver" of the dead-letter table "jobs_dead" is NOT NULL without a default`, column: "approver"},
		{name: "a dead-letter table that leaves out nullable columns and adds its own",
			queue: queue, dead: []CatalogColumn{col("id"), col("payload"), col("attempt"), col("locked_until"), col("customer"), col("dead_at"), col("note")},
			want: "id:ID payload:Payload attempt:Attempt locked_until:LockedUntil customer"},
		{name: "the same refusals for a requeue", requeue: true,
			queue: queue, dead: []CatalogColumn{col("id"), col("payload"), col("attempt"), col("locked_until")},
			want: "a dead-letter move would lose its value", column: "customer"},
		{name: "a described column the dead-letter table lacks",
			queue: queue, dead: []CatalogColumn{col("id"), col("payload"), col("locked_until"), col("customer")},
			want: `has no column "attempt" (Table.Attempt)`, column: "attempt"},
		{name: "no dead-letter table", queue: queue, want: `the dead-letter table "jobs_dead" does not exist`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := MoveColumns(tb, "jobs_dead", c.queue, c.dead, c.fold, c.requeue)
			if c.column == "" && !strings.Contains(c.want, "does not exist") {
				if err != nil || names(got, c.requeue) != c.want {
					t.Fatalf("MoveColumns = %q, %v\nwant %q", names(got, c.requeue), err, c.want)
				}
				return
			}
			var ce *dialects.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) || ce.Column != c.column || ce.Table != "jobs" || ce.Fix == "" {
				t.Fatalf("MoveColumns = %q, %v; want a *ConfigError on column %q saying %q", names(got, c.requeue), err, c.column, c.want)
			}
			if c.column != "" && !strings.Contains(ce.Fix, c.column) {
				t.Fatalf("the fix %q does not name the column %q", ce.Fix, c.column)
			}
		})
	}
}

// TestDeadLetterColumns: the dead-letter table's name is checked (without case where the
// database folds names, by the very name where it keeps them) before either catalog is
// read; then both catalogs are read and compared as MoveColumns compares them.
func TestDeadLetterColumns(t *testing.T) {
	tb := dialects.Table{Name: "jobs", ID: "id", Payload: "payload"}
	catalogs := map[string][]CatalogColumn{
		"jobs":      {{Name: "id"}, {Name: "payload", Required: true}},
		"Jobs":      {{Name: "ID"}, {Name: "Payload"}},
		"jobs_dead": {{Name: "ID"}, {Name: "Payload"}},
	}
	for _, c := range []struct {
		dest string
		fold bool
		want string // the columns (queue>dead), or the refusal's fix
	}{
		{dest: "jobs_dead", fold: true, want: "id>ID payload>Payload"},
		{dest: "jobs_dead", want: `the dead-letter table "jobs_dead" has no column "id"`},
		{dest: "Jobs", fold: true, want: "name another table, or use a dead-letter group"},
		{dest: "Jobs", want: `the dead-letter table "Jobs" has no column "id"`},
		{dest: "jobs", want: "name another table, or use a dead-letter group"},
		{dest: "x.jobs_dead", fold: true, want: "name the dead-letter table alone (it lives in the queue table's database)"},
		{dest: "x.jobs_dead", want: "name the dead-letter table alone"},
	} {
		var read []string
		catalogOf := func(_ context.Context, table string) ([]CatalogColumn, error) {
			read = append(read, table)
			return catalogs[table], nil
		}
		cols, err := DeadLetterColumns(context.Background(), tb, c.dest, c.fold, false, catalogOf)
		var got string
		var ce *dialects.ConfigError
		switch {
		case err == nil:
			var out []string
			for _, m := range cols {
				out = append(out, m.Name+">"+m.DeadName)
			}
			got = strings.Join(out, " ")
		case errors.As(err, &ce) && strings.HasPrefix(c.want, "name "):
			got = ce.Fix
			if len(read) != 0 {
				t.Errorf("%q (fold %v): read the catalogs of %v before refusing the name", c.dest, c.fold, read)
			}
		case errors.As(err, &ce):
			got = ce.Reason
		default:
			got = err.Error()
		}
		if !strings.HasPrefix(got, c.want) || (strings.HasPrefix(c.want, "name ") && got != c.want) {
			t.Errorf("%q (fold %v): %q, want %q", c.dest, c.fold, got, c.want)
		}
	}
}

// TestMoveLists: a move inserts the dead-letter table's names from the queue table's,
// a requeue the other way, each quoted, and a column's value replaces its name.
func TestMoveLists(t *testing.T) {
	cols := []MoveColumn{{Name: "id", DeadName: "ID", Role: "ID"}, {Name: "attempt", DeadName: "Attempt", Role: "Attempt"}, {Name: "note", DeadName: "note"}}
	quote := func(s string) string { return "[" + s + "]" }
	value := func(c MoveColumn) string { return RequeueValue(c.Role) }
	for _, c := range []struct {
		requeue   bool
		into, sel string
	}{
		{false, "[ID], [Attempt], [note]", "[id], 1, [note]"},
		{true, "[id], [attempt], [note]", "[ID], 1, [note]"},
	} {
		if into, sel := MoveLists(cols, c.requeue, quote, value); into != c.into || sel != c.sel {
			t.Errorf("MoveLists(requeue %v) = %q, %q; want %q, %q", c.requeue, into, sel, c.into, c.sel)
		}
	}
}
