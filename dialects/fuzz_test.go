package dialects

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// keyTemplateValid is an oracle for ParseKey written independently of it: a template is
// literal text (no braces) and {column} placeholders, each naming a non-empty column
// without braces.
func keyTemplateValid(template string) bool {
	inside, empty := false, false
	for i := 0; i < len(template); i++ {
		switch c := template[i]; {
		case c == '{' && inside, c == '}' && !inside:
			return false
		case c == '{':
			inside, empty = true, true
		case c == '}':
			if empty {
				return false
			}
			inside = false
		default:
			empty = false
		}
	}
	return !inside
}

// FuzzParseKey: any template either parses or is refused with an error, never a panic;
// a parse gives back the template exactly (literals as they are, columns as "{col}"),
// with non-empty brace-free columns, no empty part and no part both literal and column,
// and the parse succeeds exactly when the independent oracle accepts the template.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"jobs-{id}", "a-{id}", "{", "}", "{}", "{a}{b}", "x{{y}}", "", "{a}}", "}{a}",
		"naïve-{表}", "k-{`x`}-{\"y\"}-{a;b}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, template string) {
		parts, err := ParseKey(template)
		if valid := keyTemplateValid(template); valid != (err == nil) {
			t.Fatalf("ParseKey(%q): err = %v, but the template is valid = %v", template, err, valid)
		}
		if err != nil {
			if parts != nil {
				t.Fatalf("ParseKey(%q) returned parts %q with its error", template, parts)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", template)) {
				t.Fatalf("ParseKey(%q): the error %q does not quote the template", template, err)
			}
			return
		}
		var b strings.Builder
		prevLiteral := false
		for i, p := range parts {
			switch {
			case p.Column != "" && p.Literal != "":
				t.Fatalf("ParseKey(%q): part %d is both literal %q and column %q", template, i, p.Literal, p.Column)
			case p.Column != "":
				if strings.ContainsAny(p.Column, "{}") {
					t.Fatalf("ParseKey(%q): column part %d %q has a brace", template, i, p.Column)
				}
				b.WriteString("{" + p.Column + "}")
				prevLiteral = false
			case p.Literal != "":
				if prevLiteral {
					t.Fatalf("ParseKey(%q): parts %d and %d are both literals: %q", template, i-1, i, parts)
				}
				b.WriteString(p.Literal)
				prevLiteral = true
			default:
				t.Fatalf("ParseKey(%q): part %d is empty: %q", template, i, parts)
			}
		}
		if b.String() != template {
			t.Fatalf("ParseKey(%q) = %q, which concatenates to %q", template, parts, b.String())
		}
	})
}

// FuzzCheckDescription: whatever the table name, a column name and the key template,
// CheckDescription never panics, and an error is always a *ConfigError (matching
// ErrConfig) with a reason and a fix, whose Error() names the table when it has a name.
// Its verdict agrees with the rules it documents, for two descriptions built on the
// fuzzed values: a plain advisory one, and one that reuses the column in several roles
// beside a lease column.
func FuzzCheckDescription(f *testing.F) {
	f.Add("jobs", "payload", "jobs-{id}")
	f.Add("jo\"bs", "pay`load", "a-{id}")
	f.Add("semi;colon", "col -- x", "{a}{b}")
	f.Add("naïve", "表", "x{{y}}")
	f.Add("emoji🚀", "😀", "{")
	f.Add("", "", "}")
	f.Add("a.b", "id", "{}")
	f.Add(strings.Repeat("t", 65), strings.Repeat("c", 64), strings.Repeat("k", 63)+"{id}")
	f.Add("jobs", "ID", "")
	f.Fuzz(func(t *testing.T, name, col, key string) {
		plain := Table{Name: name, ID: "id", Payload: col, AdvisoryKey: key}
		check(t, plain)
		keyOK := key == "" || keyTemplateValid(key)
		wantOK := name != "" && !strings.Contains(name, ".") && col != "" && col != "id" && keyOK
		if err := CheckDescription(plain); (err == nil) != wantOK {
			t.Fatalf("CheckDescription(%+v) = %v, want ok = %v", plain, err, wantOK)
		}

		reused := Table{Name: name, ID: col, Payload: "payload", Group: col, LockedUntil: "locked_until", AdvisoryKey: key}
		check(t, reused)
		// The id and group roles both name col, so the description is refused whatever
		// the rest (a missing name or id, a bad key, a lease beside a key, or the
		// duplicate itself).
		if err := CheckDescription(reused); err == nil {
			t.Fatalf("CheckDescription(%+v) accepted a column named in two roles", reused)
		}
	})
}

// check runs CheckDescription and asserts the shape of its error.
func check(t *testing.T, tbl Table) {
	t.Helper()
	err := CheckDescription(tbl)
	if err == nil {
		for _, c := range tbl.Columns() {
			if c.Name == "" || c.Role == "" {
				t.Fatalf("Columns() of an accepted description has an empty entry: %+v", tbl.Columns())
			}
		}
		return
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("CheckDescription(%+v) = %T %v, want a *ConfigError", tbl, err, err)
	}
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("CheckDescription(%+v) = %v, which does not match ErrConfig", tbl, err)
	}
	msg := err.Error()
	if ce.Fix == "" || ce.Reason == "" || !strings.Contains(msg, "; fix: "+ce.Fix) {
		t.Fatalf("CheckDescription(%+v) = %q, without a reason or a fix", tbl, msg)
	}
	if tbl.Name != "" && (ce.Table != tbl.Name || !strings.Contains(msg, fmt.Sprintf("table %q", tbl.Name))) {
		t.Fatalf("CheckDescription(%+v) = %q, which does not name table %q", tbl, msg, tbl.Name)
	}
	if !strings.HasPrefix(msg, "rowactor: ") {
		t.Fatalf("CheckDescription(%+v) = %q, without the rowactor: prefix", tbl, msg)
	}
}
