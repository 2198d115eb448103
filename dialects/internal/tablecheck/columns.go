package tablecheck

import (
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// CheckColumns refuses a description that names a column the table lacks. have holds the
// table's real column names as the database reports them; fold says whether the database
// compares names without case (MySQL does; PostgreSQL and SQLite quoted names do not,
// though SQLite folds ASCII case).
func CheckColumns(t dialects.Table, have []string, fold bool) error {
	if len(have) == 0 {
		return &dialects.ConfigError{Table: t.Name, Reason: "the table does not exist",
			Fix: "create it first (rowactor.Schema renders its CREATE TABLE)"}
	}
	for _, c := range t.Columns() {
		found := false
		for _, h := range have {
			if h == c.Name || (fold && strings.EqualFold(h, c.Name)) {
				found = true
				break
			}
		}
		if !found {
			return &dialects.ConfigError{Table: t.Name, Column: c.Name, Option: "Table." + c.Role,
				Reason: "the table has no such column (it has " + strings.Join(have, ", ") + ")",
				Fix:    "add the column to the table, or correct Table." + c.Role}
		}
	}
	return nil
}

// NoUniqueIndex is the error of a table whose unique key column has no unique index of
// its own: a unique publish could neither refuse a second row of a key nor find the
// first.
func NoUniqueIndex(t dialects.Table, create string) error {
	return &dialects.ConfigError{Table: t.Name, Column: t.UniqueKey, Option: "Table.UniqueKey",
		Reason: "the unique key column has no unique index of its own (on that column alone, for every row)",
		Fix:    create + " (rowactor.Schema renders it)"}
}
