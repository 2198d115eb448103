package adminsql

import (
	"context"
	"fmt"
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// DeadLetterColumns checks the dead-letter table dest against the queue table's
// description and both tables' catalogs (catalogOf reads a table's columns, none when it
// does not exist), and returns the columns a dead-letter move (or, with requeue, a
// requeue) copies: every column the two tables share (MoveColumns). fold compares names
// without case, as MySQL and SQLite do; without it (PostgreSQL) names match exactly.
func DeadLetterColumns(ctx context.Context, t dialects.Table, dest string, fold, requeue bool,
	catalogOf func(ctx context.Context, table string) ([]CatalogColumn, error)) ([]MoveColumn, error) {
	if err := dialects.CheckDeadLetterName(t, dest, fold); err != nil {
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
func MoveColumns(t dialects.Table, dead string, queue, deadCols []CatalogColumn, fold, requeue bool) ([]MoveColumn, error) {
	if len(deadCols) == 0 {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "DeadLetterTable",
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
			return nil, &dialects.ConfigError{Table: t.Name, Column: c.Name, Option: "DeadLetterTable",
				Reason: fmt.Sprintf("the dead-letter table %q has no column %q (Table.%s), which the move copies", dead, c.Name, c.Role),
				Fix:    fmt.Sprintf("add column %q to table %q", c.Name, dead)}
		}
	}
	for _, q := range queue {
		if _, ok := find(deadCols, q.Name); !ok && q.Required {
			return nil, &dialects.ConfigError{Table: t.Name, Column: q.Name, Option: "DeadLetterTable",
				Reason: fmt.Sprintf("column %q is NOT NULL without a default in the queue table, and the dead-letter table %q has no such column: "+
					"a dead-letter move would lose its value, and a requeue could not give it one", q.Name, dead),
				Fix: fmt.Sprintf("add column %q to the dead-letter table %q with the queue table's type", q.Name, dead)}
		}
	}
	for _, c := range deadCols {
		if _, ok := find(queue, c.Name); !ok && c.Required {
			return nil, &dialects.ConfigError{Table: t.Name, Column: c.Name, Option: "DeadLetterTable",
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
