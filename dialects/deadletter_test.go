package dialects

import (
	"errors"
	"strings"
	"testing"
)

// TestMoveColumns: a move copies every column the two tables share by name, in the queue
// table's order, leaving out what the destination computes; it refuses a pair of tables
// that cannot keep a row whole.
func TestMoveColumns(t *testing.T) {
	tb := Table{Name: "jobs", ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
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
			queue: queue, dead: []CatalogColumn{col("id"), col("payload"), col("attempt"), col("locked_until"), col("customer"), req("reviewer")},
			want: `column "reviewer" of the dead-letter table "jobs_dead" is NOT NULL without a default`, column: "reviewer"},
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
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) || ce.Column != c.column || ce.Table != "jobs" || ce.Fix == "" {
				t.Fatalf("MoveColumns = %q, %v; want a *ConfigError on column %q saying %q", names(got, c.requeue), err, c.column, c.want)
			}
			if c.column != "" && !strings.Contains(ce.Fix, c.column) {
				t.Fatalf("the fix %q does not name the column %q", ce.Fix, c.column)
			}
		})
	}
}
