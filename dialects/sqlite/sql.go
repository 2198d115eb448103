package sqlite

import (
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// TimeLayout is how every time column (retry_after, processed_at, locked_until) is stored:
// UTC text of fixed width, so comparing the text compares the times and a lease token
// written by a claim is matched byte for byte by the settlement that names it. Rows
// published by other code must use the same layout to be compared correctly.
const TimeLayout = "2006-01-02T15:04:05.000000Z"

func formatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// attemptMax is where the attempt counter stops (sqlpart.CountAttempt): SQLite's integers
// are 64-bit, and rowactor counts no further than a 32-bit integer column holds on the
// other databases.
const attemptMax = tablecheck.MaxInteger

// quote quotes an identifier with backticks rather than double quotes: SQLite reads a
// double-quoted name that matches no column as a string literal, so a misspelled column
// would prepare and silently compare against its own name.
func quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// literal renders a string literal.
func literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// keyExpr renders an advisory key template as SQL text, so the key is computed from the
// row as it stands; NULL columns read as empty.
func keyExpr(template string) (string, error) {
	parts, err := dialects.ParseKey(template)
	if err != nil {
		return "", err
	}
	terms := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Column != "" {
			terms = append(terms, "ifnull("+quote(p.Column)+", '')")
		} else {
			terms = append(terms, literal(p.Literal))
		}
	}
	return "CAST(" + strings.Join(terms, " || ") + " AS TEXT)", nil
}

// limitParam is a claim's LIMIT: the bound :limit, as an expression. SQLite's planner
// reads a LIMIT that is a bare parameter when it plans, and then plans the statement
// again each time a new value is bound; a claim's limit changes from one claim to the
// next, so a third of a claim's CPU went to re-planning it (sqlite3Reprepare, measured on
// 10,000 claims of 1–7 rows). As an expression the value is read only as it runs.
const limitParam = ":limit + 0"

// claimable is the WHERE condition of a row that may be claimed, using the named
// parameters :group and :now. Each condition applies only when its column is described.
func claimable(t dialects.Table, lease bool) string {
	var c []string
	if t.Group != "" {
		c = append(c, quote(t.Group)+" = :group")
	}
	if t.RetryAfter != "" {
		ra := quote(t.RetryAfter)
		c = append(c, "("+ra+" IS NULL OR "+ra+" <= :now)")
	}
	if t.ProcessedAt != "" {
		c = append(c, quote(t.ProcessedAt)+" IS NULL")
	}
	if lease {
		lu := quote(t.LockedUntil)
		c = append(c, "("+lu+" IS NULL OR "+lu+" <= :now)")
	}
	if len(c) == 0 {
		return "1"
	}
	return strings.Join(c, " AND ")
}

// copyColumns lists the described columns once (Schema renders them, a group requeue
// resets their roles); names compare without case. A dead-letter move copies every
// column the tables share (deadletter.go).
func copyColumns(t dialects.Table) []dialects.NamedColumn { return t.DistinctColumns(true) }
