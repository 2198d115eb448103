package mysql

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
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
		q := quote(name)
		got, ok := dialecttest.Unquote(q, '`')
		if !ok {
			t.Fatalf("quote(%q) = %q: not one backtick-quoted identifier", name, q)
		}
		if got != name {
			t.Fatalf("quote(%q) = %q, which unquotes to %q", name, q, got)
		}
		l := literal(name)
		const pre, post = "_utf8mb4 X'", "'"
		if !strings.HasPrefix(l, pre) || !strings.HasSuffix(l, post) {
			t.Fatalf("literal(%q) = %q", name, l)
		}
		raw, err := hex.DecodeString(l[len(pre) : len(l)-len(post)])
		if err != nil || string(raw) != name {
			t.Fatalf("literal(%q) = %q, which decodes to %q (%v)", name, l, raw, err)
		}

		for _, tbl := range []dialects.Table{
			{Name: name, ID: "id", Payload: "payload"},
			{Name: "jobs", ID: "id", Payload: name},
		} {
			err := checkNames(tbl, "")
			long := utf8.RuneCountInString(name) > maxIdentifier
			if long != (err != nil) {
				t.Fatalf("checkNames(%+v) = %v for a %d-character name", tbl, err, utf8.RuneCountInString(name))
			}
			if err == nil {
				continue
			}
			var ce *dialects.ConfigError
			if !errors.As(err, &ce) || ce.Fix == "" || !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) {
				t.Fatalf("checkNames(%+v) = %v: want a *ConfigError naming %q with a fix", tbl, err, name)
			}
		}
		if n := utf8.RuneCountInString(LockName("test", name)); n > 64 {
			t.Fatalf("LockName(test, %q) is %d characters", name, n)
		}
	})
}
