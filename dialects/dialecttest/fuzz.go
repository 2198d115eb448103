package dialecttest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
)

// Quoting is a dialect's quoting of identifiers and literals and its check of names, as
// its FuzzQuote hands them to CheckQuoting (they are unexported in the dialect's package).
type Quoting struct {
	// Quote quotes an identifier between Mark, doubling Mark inside it.
	Quote func(name string) string
	Mark  byte
	// Literal renders text as an SQL literal; Unliteral undoes it, reporting false for a
	// form the server would not read back as exactly one literal.
	Literal   func(s string) string
	Unliteral func(lit string) (string, bool)
	// CheckNames is the dialect's check of a description's names, and TooLong says which
	// names it must refuse. nil: the dialect has no limit on names.
	CheckNames func(tbl dialects.Table, deadLetterTable string) error
	TooLong    func(name string) bool
}

// CheckQuoting is a FuzzQuote body: name, quoted, is one identifier that unquotes to name,
// so a name with quotes, backticks, semicolons or unicode cannot end the identifier early;
// its literal reads back as name; and a name as a table or column is refused with a
// *ConfigError naming it and giving a fix exactly when it is too long.
func CheckQuoting(t *testing.T, name string, q Quoting) {
	t.Helper()
	quoted := q.Quote(name)
	got, ok := Unquote(quoted, q.Mark)
	if !ok {
		t.Fatalf("quote(%q) = %q: not one identifier quoted with %c", name, quoted, q.Mark)
	}
	if got != name {
		t.Fatalf("quote(%q) = %q, which unquotes to %q", name, quoted, got)
	}
	l := q.Literal(name)
	if got, ok := q.Unliteral(l); !ok || got != name {
		t.Fatalf("literal(%q) = %q, which reads back as %q (ok %v)", name, l, got, ok)
	}
	if q.CheckNames == nil {
		return
	}
	for _, tbl := range []dialects.Table{
		{Name: name, ID: "id", Payload: "payload"},
		{Name: "jobs", ID: "id", Payload: name},
	} {
		err := q.CheckNames(tbl, "")
		if q.TooLong(name) != (err != nil) {
			t.Fatalf("checkNames(%+v) = %v for a name of %d bytes, %d characters", tbl, err, len(name), utf8.RuneCountInString(name))
		}
		if err == nil {
			continue
		}
		var ce *dialects.ConfigError
		if !errors.As(err, &ce) || ce.Fix == "" || !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) {
			t.Fatalf("checkNames(%+v) = %v: want a *ConfigError naming %q with a fix", tbl, err, name)
		}
	}
}
