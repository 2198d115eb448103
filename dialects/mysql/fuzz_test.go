package mysql

import (
	"encoding/hex"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// FuzzQuote: any identifier is quoted between backticks with every backtick inside
// doubled, so the quoted form has no lone backtick and unquotes to the identifier: a name
// with quotes, backticks, semicolons or unicode cannot end the identifier early. Literals
// (advisory key text) are hex, whatever sql_mode says about backslashes, and decode to
// the text. Names over 64 characters are refused with a *ConfigError naming them, and
// names up to 64 are not; a GET_LOCK name is never over 64 characters.
func FuzzQuote(f *testing.F) {
	f.Add("jobs")
	f.Add("a`b")
	f.Add(`a"b\';--`)
	f.Fuzz(func(t *testing.T, name string) {
		dialecttest.CheckQuoting(t, name, dialecttest.Quoting{
			Quote: quote, Mark: '`', Literal: literal, Unliteral: unhex,
			CheckNames: checkNames,
			TooLong:    func(name string) bool { return utf8.RuneCountInString(name) > maxIdentifier },
		})
		if n := utf8.RuneCountInString(LockName("test", name)); n > 64 {
			t.Fatalf("LockName(test, %q) is %d characters", name, n)
		}
	})
}

// unhex reads back a literal: hex, whatever sql_mode says about backslashes.
func unhex(l string) (string, bool) {
	const pre, post = "_utf8mb4 X'", "'"
	if !strings.HasPrefix(l, pre) || !strings.HasSuffix(l, post) || len(l) < len(pre)+len(post) {
		return "", false
	}
	raw, err := hex.DecodeString(l[len(pre) : len(l)-len(post)])
	return string(raw), err == nil
}
