package tablecheck

import (
	"fmt"
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// CheckOutboxDescription refuses an outbox description no database can serve: a missing
// name or required column, a dotted name, a column named twice.
func CheckOutboxDescription(t dialects.OutboxTable) error {
	if t.Name == "" {
		return &dialects.ConfigError{Option: "outbox.Table.Name", Reason: "the outbox table has no name", Fix: "set Table.Name"}
	}
	if strings.Contains(t.Name, ".") {
		return &dialects.ConfigError{Table: t.Name, Option: "outbox.Table.Name", Reason: "a table name is one identifier without a dot",
			Fix: "name the table alone"}
	}
	for _, req := range []struct{ role, name string }{
		{"ID", t.ID}, {"Topic", t.Topic}, {"Payload", t.Payload}, {"SentAt", t.SentAt}, {"ProcessedAt", t.ProcessedAt},
	} {
		if req.name == "" {
			return &dialects.ConfigError{Table: t.Name, Option: "outbox.Table." + req.role,
				Reason: "the " + req.role + " column is required in an outbox table",
				Fix:    "set Table." + req.role + " (outbox.Schema renders a table with every column)"}
		}
	}
	return checkDistinct(t.Name, "outbox.Table.", t.Columns())
}

// CheckDedupeDescription refuses a dedupe description no database can serve.
func CheckDedupeDescription(t dialects.DedupeTable) error {
	if t.Name == "" {
		return &dialects.ConfigError{Option: "outbox.DedupeTable.Name", Reason: "the dedupe table has no name", Fix: "set DedupeTable.Name"}
	}
	if strings.Contains(t.Name, ".") {
		return &dialects.ConfigError{Table: t.Name, Option: "outbox.DedupeTable.Name", Reason: "a table name is one identifier without a dot",
			Fix: "name the table alone"}
	}
	if t.ID == "" {
		return &dialects.ConfigError{Table: t.Name, Option: "outbox.DedupeTable.ID", Reason: "the id column is required",
			Fix: "set DedupeTable.ID"}
	}
	return checkDistinct(t.Name, "outbox.DedupeTable.", t.Columns())
}

func checkDistinct(table, prefix string, cols []dialects.NamedColumn) error {
	seen := map[string]string{}
	for _, c := range cols {
		if prev, ok := seen[c.Name]; ok {
			return &dialects.ConfigError{Table: table, Column: c.Name, Option: prefix + c.Role,
				Reason: "the column already plays the role " + prev, Fix: "give each role its own column"}
		}
		seen[c.Name] = c.Role
	}
	return nil
}

// CheckNamedColumns refuses a description (of an outbox or dedupe table) that names a
// column the live table lacks, naming the table, the column and the fix. have holds the
// table's columns as the database reports them; fold says whether names compare without
// case. schemaFunc names the function that renders the table ("outbox.Schema").
func CheckNamedColumns(table, prefix, schemaFunc string, cols []dialects.NamedColumn, have []string, fold bool) error {
	if len(have) == 0 {
		return &dialects.ConfigError{Table: table, Reason: "the table does not exist",
			Fix: "create it first (" + schemaFunc + " renders its CREATE TABLE)"}
	}
	for _, c := range cols {
		found := false
		for _, h := range have {
			if h == c.Name || (fold && strings.EqualFold(h, c.Name)) {
				found = true
				break
			}
		}
		if !found {
			return &dialects.ConfigError{Table: table, Column: c.Name, Option: prefix + c.Role,
				Reason: fmt.Sprintf("the table has no such column (it has %s)", strings.Join(have, ", ")),
				Fix:    "add the column to the table (" + schemaFunc + " renders it), or correct " + strings.TrimPrefix(prefix, "outbox.") + c.Role}
		}
	}
	return nil
}
