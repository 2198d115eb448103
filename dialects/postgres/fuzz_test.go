package postgres

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// FuzzQuote: any identifier is quoted between double quotes with every double quote
// inside doubled, so the quoted form has no lone double quote and unquotes to the
// identifier: a name with quotes, backticks, semicolons or unicode cannot end the
// identifier early. Literals (advisory key text) are escape strings, E'…', with quotes
// and backslashes escaped, so they read the same under either standard_conforming_strings
// and no quote or backslash ends them early. Names over 63 bytes, which
// the server would truncate, are refused with a *ConfigError naming them, and names up to
// 63 bytes are not; the claim index's name always fits in 63 bytes.
func FuzzQuote(f *testing.F) {
	f.Add("jobs")
	f.Add(`a"b`)
	f.Add("a`b;--")
	f.Fuzz(func(t *testing.T, name string) {
		q := quote(name)
		got, ok := dialecttest.Unquote(q, '"')
		if !ok {
			t.Fatalf("quote(%q) = %q: not one double-quoted identifier", name, q)
		}
		if got != name {
			t.Fatalf("quote(%q) = %q, which unquotes to %q", name, q, got)
		}
		l := literal(name)
		got, ok = unescapeFuzz(l)
		if !ok || got != name {
			t.Fatalf("literal(%q) = %q, which unquotes to %q (ok %v)", name, l, got, ok)
		}

		for _, tbl := range []dialects.Table{
			{Name: name, ID: "id", Payload: "payload"},
			{Name: "jobs", ID: "id", Payload: name},
		} {
			err := checkNames(tbl, "")
			long := len(name) > maxIdent
			if long != (err != nil) {
				t.Fatalf("checkNames(%+v) = %v for a %d-byte name", tbl, err, len(name))
			}
			if err == nil {
				continue
			}
			var ce *dialects.ConfigError
			if !errors.As(err, &ce) || ce.Fix == "" || !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) {
				t.Fatalf("checkNames(%+v) = %v: want a *ConfigError naming %q with a fix", tbl, err, name)
			}
		}
		if len(name) <= maxIdent {
			idx := indexName(name)
			if len(idx) > maxIdent || (utf8.ValidString(name) && !utf8.ValidString(idx)) {
				t.Fatalf("indexName(%q) = %q (%d bytes)", name, idx, len(idx))
			}
		}
	})
}
