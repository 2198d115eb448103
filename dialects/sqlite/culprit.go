package sqlite

import (
	"errors"
	"regexp"

	"modernc.org/sqlite"

	"github.com/rowactor/rowactor/dialects"
)

// SQLite names a culprit only in its message text: "NOT NULL constraint failed:
// table.column", "UNIQUE constraint failed: table.column[, table.column…]", "CHECK
// constraint failed: name" (the constraint's name, or its expression when unnamed).
var (
	columnConstraint = regexp.MustCompile(`(?:NOT NULL|UNIQUE) constraint failed: ([^ .,]+)\.([^ ,]+)`)
	checkConstraint  = regexp.MustCompile(`CHECK constraint failed: (.+?)(?: \(\d+\))?$`)
)

// Culprit reads the table, column or constraint an SQLite error names in its message.
func (d *Dialect) Culprit(err error) dialects.Culprit {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return dialects.Culprit{}
	}
	msg := se.Error()
	if m := columnConstraint.FindStringSubmatch(msg); m != nil {
		return dialects.Culprit{Table: m[1], Column: m[2]}
	}
	if m := checkConstraint.FindStringSubmatch(msg); m != nil {
		return dialects.Culprit{Constraint: m[1]}
	}
	return dialects.Culprit{}
}
