package postgres

import (
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
)

// maxIdent is PostgreSQL's identifier limit in bytes (NAMEDATALEN - 1). Longer names are
// truncated by the server without an error, so rowactor refuses them instead.
const maxIdent = 63

// quote quotes an identifier with double quotes, doubling embedded ones.
func quote(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// literal renders a string literal as an escape string, E'…', with backslashes and quotes
// escaped: it means the same text whatever the session's standard_conforming_strings (a
// plain '…' reads a backslash as an escape when the setting is off, so a key would change
// its text between two processes, or end early). Values that can be bound are bound
// instead.
func literal(s string) string {
	return "E'" + literalEscaper.Replace(s) + "'"
}

var literalEscaper = strings.NewReplacer(`\`, `\\`, `'`, `''`)

// keyExpr renders an advisory key template as SQL: concat ignores NULL arguments, so a
// NULL column reads as empty, and it renders any column type as its text.
func keyExpr(template string) (string, error) {
	parts, err := dialects.ParseKey(template)
	if err != nil {
		return "", err
	}
	terms := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Column != "" {
			terms = append(terms, quote(p.Column))
		} else {
			terms = append(terms, literal(p.Literal))
		}
	}
	return "concat(" + strings.Join(terms, ", ") + ")", nil
}

// param is a value a statement binds; a statement's parameters are numbered $1..$n in the
// order they first appear in its text, and a parameter used twice keeps its number.
type param uint8

const (
	pID    param = iota + 1 // the row's id
	pToken                  // the lease token (locked_until as the claim wrote it)
	pNow                    // the claim's or settlement's "now"
	pGroup                  // the subscription's group
	pUntil                  // the new lease expiry
	pLimit                  // how many rows a claim takes
	pAt                     // when a delayed row becomes due
	pDest                   // the dead-letter group
	pSkip                   // the ids set aside in memory (a bigint[])
	pKey                    // the advisory key a session locked
	pErr                    // the outcome's error text for the error column (NULL when none)
)

// bind holds the values a statement's parameters take.
type bind struct {
	id         int64
	token      time.Time
	now, until time.Time
	at         time.Time
	group      string
	dest       string
	key        string
	limit      int64
	skip       []int64
	err        any // nil or a string: Step.ErrorValue
}

// stmt is a statement text and the values of its $n, in order. An empty text is a
// statement the table cannot run.
type stmt struct {
	text   string
	params []param
}

func (s stmt) args(b *bind) []any {
	args := make([]any, len(s.params))
	for i, p := range s.params {
		switch p {
		case pID:
			args[i] = b.id
		case pToken:
			args[i] = b.token
		case pNow:
			args[i] = b.now
		case pGroup:
			args[i] = b.group
		case pUntil:
			args[i] = b.until
		case pLimit:
			args[i] = b.limit
		case pAt:
			args[i] = b.at
		case pDest:
			args[i] = b.dest
		case pSkip:
			args[i] = b.skip
		case pKey:
			args[i] = b.key
		case pErr:
			args[i] = b.err
		}
	}
	return args
}

// builder writes a statement and numbers its parameters.
type builder struct {
	b      strings.Builder
	params []param
}

func (w *builder) w(s ...string) *builder {
	for _, x := range s {
		w.b.WriteString(x)
	}
	return w
}

// p returns the placeholder of a parameter, numbering it on first use.
func (w *builder) p(p param) string {
	for i, q := range w.params {
		if q == p {
			return "$" + strconv.Itoa(i+1)
		}
	}
	w.params = append(w.params, p)
	return "$" + strconv.Itoa(len(w.params))
}

func (w *builder) stmt() stmt { return stmt{text: w.b.String(), params: w.params} }

// claimable is the condition of a row that may be claimed, qualified by alias (which may
// be empty). Each condition applies only when its column is described: in the group,
// due, unfinished, and (lease form) not leased.
func claimable(w *builder, t dialects.Table, alias string, lease bool) string {
	col := func(name string) string {
		if alias == "" {
			return quote(name)
		}
		return alias + "." + quote(name)
	}
	var c []string
	if t.Group != "" {
		c = append(c, col(t.Group)+" = "+w.p(pGroup))
	}
	if t.RetryAfter != "" {
		ra := col(t.RetryAfter)
		c = append(c, "("+ra+" IS NULL OR "+ra+" <= "+w.p(pNow)+")")
	}
	if t.ProcessedAt != "" {
		c = append(c, col(t.ProcessedAt)+" IS NULL")
	}
	if lease {
		lu := col(t.LockedUntil)
		c = append(c, "("+lu+" IS NULL OR "+lu+" <= "+w.p(pNow)+")")
	}
	if len(c) == 0 {
		return "TRUE"
	}
	return strings.Join(c, " AND ")
}

// rowColumns lists what a claim reads, in scanRow's order: id, payload[, attempt]
// [, headers]. attempt is the expression to read the attempt with (the column, or the
// column less one after a count).
func rowColumns(t dialects.Table, alias, attempt string) string {
	col := func(name string) string {
		if alias == "" {
			return quote(name)
		}
		return alias + "." + quote(name)
	}
	s := col(t.ID) + ", " + col(t.Payload)
	if t.Attempt != "" {
		s += ", " + attempt
	}
	if t.Headers != "" {
		s += ", " + col(t.Headers)
	}
	return s
}

// copyColumns lists the described columns once (Schema renders them, a group requeue
// resets their roles); PostgreSQL compares quoted names with their case. A dead-letter
// move copies every column the tables share (deadletter.go).
func copyColumns(t dialects.Table) []dialects.NamedColumn { return t.DistinctColumns(false) }

// txOptions opens a transaction at a declared isolation level; plain BEGIN (the server's
// default) when none is declared. Read uncommitted is refused by Open.
func txOptions(level dialects.Isolation) pgx.TxOptions {
	switch level {
	case dialects.ReadCommitted:
		return pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	case dialects.RepeatableRead:
		return pgx.TxOptions{IsoLevel: pgx.RepeatableRead}
	case dialects.Serializable:
		return pgx.TxOptions{IsoLevel: pgx.Serializable}
	}
	return pgx.TxOptions{}
}

// beginSQL is the BEGIN that txOptions(level) sends.
func beginSQL(level dialects.Isolation) string {
	switch level {
	case dialects.ReadCommitted:
		return "BEGIN ISOLATION LEVEL READ COMMITTED"
	case dialects.RepeatableRead:
		return "BEGIN ISOLATION LEVEL REPEATABLE READ"
	case dialects.Serializable:
		return "BEGIN ISOLATION LEVEL SERIALIZABLE"
	}
	return "BEGIN"
}
