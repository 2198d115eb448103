package mysql

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
)

// maxIdentifier is the longest name MySQL accepts for a table, column or index.
const maxIdentifier = 64

// quote quotes an identifier with backticks, doubling any inside it.
func quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// literal renders a string literal as utf8mb4 hex: its value does not depend on the
// session's sql_mode (NO_BACKSLASH_ESCAPES changes what a backslash in quotes means).
func literal(s string) string {
	return "_utf8mb4 X'" + hex.EncodeToString([]byte(s)) + "'"
}

// utf8mb4 converts an SQL string expression to utf8mb4, so key texts built from columns of
// any character set (and DATABASE(), which is utf8mb3) compare, count and hash alike.
func utf8mb4(expr string) string { return "CONVERT(" + expr + " USING utf8mb4)" }

// keyText renders an advisory key template as SQL: the key as the row stands, NULL columns
// skipped (CONCAT_WS skips NULLs), as utf8mb4 text.
func keyText(template string) (string, error) {
	parts, err := dialects.ParseKey(template)
	if err != nil {
		return "", err
	}
	terms := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Column != "" {
			terms = append(terms, utf8mb4(quote(p.Column)))
		} else {
			terms = append(terms, literal(p.Literal))
		}
	}
	if len(terms) == 0 {
		return "''", nil
	}
	return utf8mb4("CONCAT_WS('', " + strings.Join(terms, ", ") + ")"), nil
}

// lockNameExpr renders the GET_LOCK name of a key text expression: the lower-cased
// database name, a dot and the key; its SHA-256 hex when that is longer than 64 characters
// (MySQL refuses longer lock names). Candidates apply it to the row's key text and
// sessions to the key text the candidate returned, so both name the same lock.
func lockNameExpr(key string) string {
	full := "CONCAT_WS('', " + utf8mb4("LOWER(DATABASE())") + ", '.', " + key + ")"
	return "IF(CHAR_LENGTH(" + full + ") > 64, SHA2(" + full + ", 256), " + full + ")"
}

// LockName is the GET_LOCK name of an advisory key in database: the lower-cased database
// name, a dot and the key, or the SHA-256 hex of that text when it is longer than 64
// characters. It mirrors the name the dialect computes in SQL (for database names that
// Go and the server lower-case alike), so an operator can look a key up with
// IS_USED_LOCK(name).
func LockName(database, key string) string {
	full := strings.ToLower(database) + "." + key
	if utf8.RuneCountInString(full) > 64 {
		sum := sha256.Sum256([]byte(full))
		return hex.EncodeToString(sum[:])
	}
	return full
}

// dbTime is how every time is bound: UTC, whole microseconds (DATETIME(6) keeps no more,
// and the server would round rather than cut the rest), so a lease token compares equal
// to the value the claim stored.
func dbTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// claimable is the WHERE condition of a row that may be claimed, with ? placeholders whose
// values claimArgs lists in the same order. Each condition applies only when its column
// is described; lease adds the lease-free condition.
type claimable struct {
	where    string
	group    bool
	due      bool
	leaseArg bool
}

func newClaimable(t dialects.Table, lease bool) claimable {
	var c []string
	cl := claimable{}
	if t.Group != "" {
		c = append(c, quote(t.Group)+" = ?")
		cl.group = true
	}
	if t.RetryAfter != "" {
		ra := quote(t.RetryAfter)
		c = append(c, "("+ra+" IS NULL OR "+ra+" <= ?)")
		cl.due = true
	}
	if t.ProcessedAt != "" {
		c = append(c, quote(t.ProcessedAt)+" IS NULL")
	}
	if lease {
		lu := quote(t.LockedUntil)
		c = append(c, "("+lu+" IS NULL OR "+lu+" <= ?)")
		cl.leaseArg = true
	}
	if len(c) == 0 {
		cl.where = "TRUE"
	} else {
		cl.where = strings.Join(c, " AND ")
	}
	return cl
}

// args appends the condition's values to dst.
func (c claimable) args(dst []any, group string, now time.Time) []any {
	if c.group {
		dst = append(dst, group)
	}
	if c.due {
		dst = append(dst, dbTime(now))
	}
	if c.leaseArg {
		dst = append(dst, dbTime(now))
	}
	return dst
}

// copyColumns lists the described columns once (Schema renders them, a group requeue
// resets their roles); names compare without case. A dead-letter move copies every
// column the tables share (deadletter.go).
func copyColumns(t dialects.Table) []dialects.NamedColumn { return t.DistinctColumns(true) }

// rowColumns is the select list of a claimed row: id, payload[, attempt (less one when
// the statement reads the row after counting)][, headers].
func rowColumns(t dialects.Table, counted bool) string {
	s := quote(t.ID) + ", " + quote(t.Payload)
	if t.Attempt != "" {
		s += ", " + quote(t.Attempt)
		if counted {
			s += " - 1"
		}
	}
	if t.Headers != "" {
		s += ", " + quote(t.Headers)
	}
	return s
}

// placeholders renders n comma-separated "?".
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}
