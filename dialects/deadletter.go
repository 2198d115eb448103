package dialects

import (
	"fmt"
	"strings"
)

// DistinctColumns lists every described column once, in description order: the columns
// Schema renders. A key placeholder may name a role column again; it is listed once.
//
// fold compares names without case, as SQLite and MySQL do. A dead-letter move copies
// more: every column the two tables share.
func (t Table) DistinctColumns(fold bool) []NamedColumn {
	var out []NamedColumn
	for _, c := range t.Columns() {
		dup := false
		for _, o := range out {
			if o.Name == c.Name || (fold && strings.EqualFold(o.Name, c.Name)) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, c)
		}
	}
	return out
}

// CheckDeadLetterName refuses a dead-letter table name that is not one identifier, or
// that names the queue table itself.
//
// fold compares the names without case, as MySQL and SQLite do. PostgreSQL passes false:
// its quoted names keep their case, so only the very name is the queue table itself, and
// the fix for a dotted name does not say where the table lives, since PostgreSQL finds
// it on the search_path.
func CheckDeadLetterName(t Table, dest string, fold bool) error {
	if strings.Contains(dest, ".") {
		fix := "name the dead-letter table alone"
		if fold {
			fix += " (it lives in the queue table's database)"
		}
		return &ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: fmt.Sprintf("dead-letter table %q: a table name is one identifier without a dot", dest),
			Fix:    fix}
	}
	if dest == t.Name || (fold && strings.EqualFold(dest, t.Name)) {
		return &ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: "the dead-letter table is the queue table itself",
			Fix:    "name another table, or use a dead-letter group"}
	}
	return nil
}

// A dead-letter move keeps the whole row. It copies every column the queue table and
// the dead-letter table share by name, without case where the database folds names, not
// only the columns the description names: a service's own columns, such as a customer,
// an amount or a JSON document, are the row as much as its payload. The catalog lists
// them when the subscription starts or the requeue begins, and the move's statements are
// built once from that list. A requeue copies the same columns the other way.
//
// Columns the destination computes, GENERATED ALWAYS AS (…) virtual or stored, are left
// out: no INSERT may write them, and the destination computes them again. An identity
// or auto-increment id is copied, so the row keeps its id in both directions.
// PostgreSQL's GENERATED ALWAYS AS IDENTITY is written with OVERRIDING SYSTEM VALUE.
//
// A pair of tables that cannot keep a row whole is refused with a *ConfigError naming
// the column and the fix:
//
//   - a column one table has as NOT NULL without a default, and the other lacks. Moved
//     one way, its value would be lost and the row could not come back; moved the other
//     way, every INSERT would fail;
//   - a described column the dead-letter table lacks.
//
// A nullable or defaulted column only one table has is the service's choice. A
// dead-letter table may leave out what it does not keep, or add columns of its own,
// such as a time of death with a default.

// Culprit is what a failed statement's error blames, as far as the driver tells: the
// constraint that refused a row, or the column whose value it could not take. An empty
// field is not known.
type Culprit struct {
	Table      string
	Column     string
	Constraint string
}

// CulpritNamer is a dialect that can read the culprit out of its driver's errors.
type CulpritNamer interface {
	Culprit(err error) Culprit
}

// CulpritOf asks d for the culprit of err when d can tell, and returns the zero Culprit
// otherwise.
func CulpritOf(d Dialect, err error) Culprit {
	if c, ok := d.(CulpritNamer); ok && err != nil {
		return c.Culprit(err)
	}
	return Culprit{}
}
