package postgres

import (
	"testing"
	"unicode/utf8"

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
		dialecttest.CheckQuoting(t, name, dialecttest.Quoting{
			Quote: quote, Mark: '"', Literal: literal, Unliteral: unescapeFuzz,
			CheckNames: checkNames,
			TooLong:    func(name string) bool { return len(name) > maxIdent },
		})
		if len(name) <= maxIdent {
			idx := indexName(name)
			if len(idx) > maxIdent || (utf8.ValidString(name) && !utf8.ValidString(idx)) {
				t.Fatalf("indexName(%q) = %q (%d bytes)", name, idx, len(idx))
			}
		}
	})
}
