package dialects

import (
	"context"
	"fmt"
	"strings"
)

// DistinctColumns lists every described column once (a key placeholder may name a role
// column again), in description order: the columns Schema renders. fold compares names without
// case, as SQLite and MySQL do. A dead-letter move copies more: MoveColumns.
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
// that names the queue table itself (compared without case).
func CheckDeadLetterName(t Table, dest string) error {
	return checkDeadLetterName(t, dest, true)
}

// checkDeadLetterName is CheckDeadLetterName; fold compares the names without case, as
// MySQL and SQLite do. Without fold (PostgreSQL, where quoted names keep their case) only
// the very name is the queue table itself, and the fix for a dotted name does not say
// where the table lives (PostgreSQL finds it on the search_path).
func checkDeadLetterName(t Table, dest string, fold bool) error {
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

// DeadLetterColumns checks the dead-letter table dest against the queue table's
// description and both tables' catalogs (catalogOf reads a table's columns, none when it
// does not exist), and returns the columns a dead-letter move (or, with requeue, a
// requeue) copies: every column the two tables share (MoveColumns). fold compares names
// without case, as MySQL and SQLite do; without it (PostgreSQL) names match exactly.
func DeadLetterColumns(ctx context.Context, t Table, dest string, fold, requeue bool,
	catalogOf func(ctx context.Context, table string) ([]CatalogColumn, error)) ([]MoveColumn, error) {
	if err := checkDeadLetterName(t, dest, fold); err != nil {
		return nil, err
	}
	queue, err := catalogOf(ctx, t.Name)
	if err != nil {
		return nil, err
	}
	dead, err := catalogOf(ctx, dest)
	if err != nil {
		return nil, err
	}
	return MoveColumns(t, dest, queue, dead, fold, requeue)
}

// MoveLists renders a move's INSERT column list (the destination's names) and its SELECT
// list (the source's names, or the value value gives a column's role instead), names
// quoted with quote. A move goes from the queue table into the dead-letter table; with
// requeue, the other way.
func MoveLists(cols []MoveColumn, requeue bool, quote func(string) string, value func(MoveColumn) string) (into, sel string) {
	names, values := make([]string, len(cols)), make([]string, len(cols))
	for i, c := range cols {
		from, to := c.Name, c.DeadName
		if requeue {
			from, to = c.DeadName, c.Name
		}
		names[i] = quote(to)
		values[i] = quote(from)
		if v := value(c); v != "" {
			values[i] = v
		}
	}
	return strings.Join(names, ", "), strings.Join(values, ", ")
}

// A dead-letter move keeps the whole row. It copies every column the queue table and
// the dead-letter table share by name (without case where the database folds names), as
// the catalog lists them when the subscription starts (or the requeue begins), not only
// the columns the description names: a service's own columns (a customer, an amount, a
// JSON document) are the row as much as its payload. The move's statements are built
// once from that list. A requeue copies the same columns the other way.
//
// Columns the destination computes (GENERATED ALWAYS AS (…), virtual or stored) are left
// out: no INSERT may write them, and the destination computes them again. An identity or
// auto-increment id is copied: the row keeps its id in both directions (PostgreSQL's
// GENERATED ALWAYS AS IDENTITY is written with OVERRIDING SYSTEM VALUE).
//
// A pair of tables that cannot keep a row whole is refused with a *ConfigError naming
// the column and the fix:
//   - a column one table has as NOT NULL without a default, and the other lacks: moved
//     one way its value would be lost (and the row could not come back), moved the other
//     way every INSERT would fail;
//   - a described column the dead-letter table lacks (as before).
// A nullable (or defaulted) column only one table has is the service's choice: a
// dead-letter table may leave out what it does not keep, or add columns of its own (a
// time of death with a default).

// CatalogColumn is a live column as the database's catalog describes it.
type CatalogColumn struct {
	Name string
	// Required says an INSERT must give the column a value: NOT NULL, with no default,
	// no identity or auto-increment, and not computed.
	Required bool
	// Generated says the database computes the column (GENERATED ALWAYS AS (…), a
	// virtual or stored column): an INSERT cannot write it.
	Generated bool
}

// MoveColumn is a column a move or a requeue copies.
type MoveColumn struct {
	// Name is the column's name in the queue table; DeadName its name in the dead-letter
	// table (the same but for case, where names fold).
	Name     string
	DeadName string
	// Role is the role the description gives the column ("ID", "LockedUntil", …); "" for
	// a column of the service's own.
	Role string
}

// MoveColumns lists the columns a dead-letter move from the queue table (columns queue)
// into the dead-letter table dead (columns deadCols) copies, in the queue table's order;
// requeue lists those a requeue copies back. It refuses, with a *ConfigError, a
// dead-letter table that does not exist, that lacks a described column, or that could
// not keep a row whole (see above). fold compares names without case.
func MoveColumns(t Table, dead string, queue, deadCols []CatalogColumn, fold, requeue bool) ([]MoveColumn, error) {
	if len(deadCols) == 0 {
		return nil, &ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: fmt.Sprintf("the dead-letter table %q does not exist", dead),
			Fix:    "create it with the queue table's columns (rowactor.Schema renders the described ones; add the table's own)"}
	}
	same := func(a, b string) bool { return a == b || (fold && strings.EqualFold(a, b)) }
	find := func(cols []CatalogColumn, name string) (CatalogColumn, bool) {
		for _, c := range cols {
			if same(c.Name, name) {
				return c, true
			}
		}
		return CatalogColumn{}, false
	}
	for _, c := range t.DistinctColumns(fold) {
		if _, ok := find(deadCols, c.Name); !ok {
			return nil, &ConfigError{Table: t.Name, Column: c.Name, Option: "DeadLetterTable",
				Reason: fmt.Sprintf("the dead-letter table %q has no column %q (Table.%s), which the move copies", dead, c.Name, c.Role),
				Fix:    fmt.Sprintf("add column %q to table %q", c.Name, dead)}
		}
	}
	for _, q := range queue {
		if _, ok := find(deadCols, q.Name); !ok && q.Required {
			return nil, &ConfigError{Table: t.Name, Column: q.Name, Option: "DeadLetterTable",
				Reason: fmt.Sprintf("column %q is NOT NULL without a default in the queue table, and the dead-letter table %q has no such column: "+
					"a dead-letter move would lose its value, and a requeue could not give it one", q.Name, dead),
				Fix: fmt.Sprintf("add column %q to the dead-letter table %q with the queue table's type", q.Name, dead)}
		}
	}
	for _, c := range deadCols {
		if _, ok := find(queue, c.Name); !ok && c.Required {
			return nil, &ConfigError{Table: t.Name, Column: c.Name, Option: "DeadLetterTable",
				Reason: fmt.Sprintf("column %q of the dead-letter table %q is NOT NULL without a default, and the queue table has no such column: "+
					"every dead-letter move would fail on it", c.Name, dead),
				Fix: fmt.Sprintf("give column %q of table %q a default or allow NULL in it, drop it, or add it to the queue table %q", c.Name, dead, t.Name)}
		}
	}
	described := t.DistinctColumns(fold)
	var out []MoveColumn
	for _, q := range queue {
		d, ok := find(deadCols, q.Name)
		if !ok {
			continue
		}
		if (!requeue && d.Generated) || (requeue && q.Generated) {
			continue // the destination computes it
		}
		m := MoveColumn{Name: q.Name, DeadName: d.Name}
		for _, c := range described {
			if same(c.Name, q.Name) {
				m.Role = c.Role
				break
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// Culprit is what a failed statement's error blames, as far as the driver tells: the
// constraint that refused a row, or the column whose value it could not take. Empty
// fields are not known.
type Culprit struct {
	Table      string
	Column     string
	Constraint string
}

// CulpritNamer is a dialect that can read the culprit out of its driver's errors.
type CulpritNamer interface {
	Culprit(err error) Culprit
}

// CulpritOf asks d for the culprit of err, when d can tell; the zero Culprit otherwise.
func CulpritOf(d Dialect, err error) Culprit {
	if c, ok := d.(CulpritNamer); ok && err != nil {
		return c.Culprit(err)
	}
	return Culprit{}
}
