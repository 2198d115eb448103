package mysql

import (
	"strings"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
)

// Schema renders the CREATE TABLE of a description, with its claim index inside it
// (MySQL has no CREATE INDEX IF NOT EXISTS; MariaDB has). Time columns are DATETIME(6)
// holding UTC; an advisory key's placeholder columns that play no role are VARCHAR(191)
// (the longest utf8mb4 VARCHAR an index on older row formats takes).
//
// The claim reads one group in id order, skipping processed rows: the index leads with the
// group and processed_at (when described), then the id, so a claim seeks straight to the
// group's unprocessed rows in claim order, however much history the table keeps.
func (d *Dialect) Schema(t dialects.Table) (string, error) {
	if err := checkDescription(t); err != nil {
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
	var idx []string
	if t.Group != "" {
		idx = append(idx, quote(t.Group))
	}
	if t.ProcessedAt != "" {
		idx = append(idx, quote(t.ProcessedAt))
	}
	if t.Priority != "" {
		idx = append(idx, quote(t.Priority)) // the claim's order: priority, then id
	}
	if len(idx) > 0 {
		idx = append(idx, quote(t.ID))
		name := t.Name + "_claim"
		if utf8.RuneCountInString(name) > maxIdentifier {
			// Index names are per table in MySQL, so a fixed name cannot collide.
			name = "rowactor_claim"
		}
		b.WriteString(",\n  INDEX " + quote(name) + " (" + strings.Join(idx, ", ") + ")")
	}
	if t.Group != "" && t.DeadAt != "" {
		// Retention of a dead-letter group reads its rows in dead_at order. MySQL has no
		// partial index: live rows sit in it too, under a NULL dead_at, and a claim never
		// reads it (its own index leads with the group and serves its order).
		b.WriteString(",\n  INDEX " + quote("rowactor_dead") + " (" + quote(t.Group) + ", " + quote(t.DeadAt) + ")")
	}
	if t.UniqueKey != "" {
		// NULLs never conflict: rows published without a key are not constrained.
		b.WriteString(",\n  UNIQUE INDEX " + quote("rowactor_unique") + " (" + quote(t.UniqueKey) + ")")
	}
	b.WriteString("\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;\n")
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
		return "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY"
	case "Payload":
		return "LONGBLOB NOT NULL"
	case "Group":
		return "VARCHAR(191) NOT NULL DEFAULT ''"
	case "Attempt":
		return "INT NOT NULL DEFAULT 1"
	case "RetryAfter", "ProcessedAt", "LockedUntil", "DeadAt":
		return "DATETIME(6) NULL"
	case "Headers":
		return "JSON NULL"
	case "Error":
		return "TEXT NULL" // up to 65535 bytes; rowactor writes at most dialects.MaxErrorBytes
	case "Priority":
		return "INT NOT NULL DEFAULT 0"
	case "UniqueKey":
		// Bytes, as PostgreSQL and SQLite compare keys: a VARCHAR's collation would make
		// keys that differ in case, accents or trailing spaces one key, and a publish of
		// the second would return the first's row and write nothing. 767 bytes: the
		// longest index key of every InnoDB row format (191 utf8mb4 characters at least).
		return "VARBINARY(767) NULL"
	}
	// Advisory key placeholder columns.
	return "VARCHAR(191) NULL"
}
