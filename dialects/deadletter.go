package dialects

import (
	"fmt"
	"strings"
)

// DistinctColumns lists every described column once (a key placeholder may name a role
// column again), in description order: the columns a dead-letter move copies. fold
// compares names without case, as SQLite and MySQL do.
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
func CheckDeadLetterName(t Table, dest string) error {
	if strings.Contains(dest, ".") {
		return &ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: fmt.Sprintf("dead-letter table %q: a table name is one identifier without a dot", dest),
			Fix:    "name the dead-letter table alone (it lives in the queue table's database)"}
	}
	if strings.EqualFold(dest, t.Name) {
		return &ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: "the dead-letter table is the queue table itself",
			Fix:    "name another table, or use a dead-letter group"}
	}
	return nil
}

// CheckDeadLetterColumns requires the dead-letter table dest to exist (have holds its
// columns as the database reports them) with every column the move copies.
func CheckDeadLetterColumns(t Table, dest string, have []string, fold bool) error {
	if len(have) == 0 {
		return &ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: fmt.Sprintf("the dead-letter table %q does not exist", dest),
			Fix:    "create it with the queue table's columns (rowactor.Schema renders them)"}
	}
	for _, c := range t.DistinctColumns(fold) {
		found := false
		for _, h := range have {
			if h == c.Name || (fold && strings.EqualFold(h, c.Name)) {
				found = true
				break
			}
		}
		if !found {
			return &ConfigError{Table: t.Name, Column: c.Name, Option: "DeadLetterTable",
				Reason: fmt.Sprintf("the dead-letter table %q has no column %q (Table.%s), which the move copies", dest, c.Name, c.Role),
				Fix:    fmt.Sprintf("add column %q to table %q", c.Name, dest)}
		}
	}
	return nil
}
