package sqlite

import (
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// Schema renders the CREATE TABLE of a description and its claim index. Time columns
// are TEXT in TimeLayout; an advisory key's placeholder columns that play no role are
// TEXT too.
func (d *Dialect) Schema(t dialects.Table) (string, error) {
	if err := dialects.CheckDescription(t); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("CREATE TABLE IF NOT EXISTS " + quote(t.Name) + " (\n")
	for i, c := range copyColumns(t) {
		if i > 0 {
			b.WriteString(",\n")
		}
		b.WriteString("  " + quote(c.Name) + " " + columnType(c.Role))
	}
	b.WriteString("\n);\n")

	// The claim reads one group in id order; rows already processed stay out of the
	// index, so a table that keeps history does not make claims scan it.
	var idx []string
	if t.Group != "" {
		idx = append(idx, quote(t.Group))
	}
	if t.Priority != "" {
		idx = append(idx, quote(t.Priority)) // the claim's order: priority, then id
	}
	if len(idx) > 0 || t.ProcessedAt != "" {
		idx = append(idx, quote(t.ID))
		b.WriteString("CREATE INDEX IF NOT EXISTS " + quote(t.Name+"_claim") + " ON " + quote(t.Name) +
			" (" + strings.Join(idx, ", ") + ")")
		if t.ProcessedAt != "" {
			b.WriteString(" WHERE " + quote(t.ProcessedAt) + " IS NULL")
		}
		b.WriteString(";\n")
	}
	if t.Group != "" && t.DeadAt != "" {
		// Retention of a dead-letter group reads its rows in dead_at order; live rows
		// (dead_at NULL) stay out, so the index costs a claim nothing. Not "<table>_dead":
		// indexes share the tables' namespace, and that is the dead-letter table's name
		// docs/forms.md suggests.
		b.WriteString("CREATE INDEX IF NOT EXISTS " + quote(t.Name+"_dead_at_idx") + " ON " + quote(t.Name) +
			" (" + quote(t.Group) + ", " + quote(t.DeadAt) + ") WHERE " + quote(t.DeadAt) + " IS NOT NULL;\n")
	}
	if t.UniqueKey != "" {
		// NULLs never conflict: rows published without a key are not constrained.
		b.WriteString("CREATE UNIQUE INDEX IF NOT EXISTS " + quote(t.Name+"_unique") + " ON " + quote(t.Name) +
			" (" + quote(t.UniqueKey) + ");\n")
	}
	cr, err := dialects.CancelRequestsDDL(d, t)
	if err != nil {
		return "", err
	}
	b.WriteString(cr)
	return b.String(), nil
}

func columnType(role string) string {
	switch role {
	case "ID":
		// AUTOINCREMENT: plain rowids reuse a deleted highest id, and a new row must never
		// be mistaken for one already delivered (dedupe by id, late settlements by id).
		return "INTEGER PRIMARY KEY AUTOINCREMENT"
	case "Payload":
		return "BLOB NOT NULL"
	case "Group":
		return "TEXT NOT NULL DEFAULT ''"
	case "Attempt":
		return "INTEGER NOT NULL DEFAULT 1"
	case "Priority":
		return "INTEGER NOT NULL DEFAULT 0"
	}
	// RetryAfter, ProcessedAt, LockedUntil, DeadAt (TimeLayout text), Headers (JSON text), Error
	// (nullable) and key placeholder columns.
	return "TEXT"
}
