package dialects

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestErrorText(t *testing.T) {
	long := strings.Repeat("a", MaxErrorBytes-1) + "é" // the last character crosses the limit
	for _, c := range []struct{ name, in, want string }{
		{"short text is kept", "boom", "boom"},
		{"exactly the limit", strings.Repeat("x", MaxErrorBytes), strings.Repeat("x", MaxErrorBytes)},
		{"cut before a character that crosses the limit", long, strings.Repeat("a", MaxErrorBytes-1)},
		{"cut on a boundary of three-byte characters", strings.Repeat("€", 1000), strings.Repeat("€", MaxErrorBytes/3)},
		{"invalid UTF-8 is replaced", "bad \xff byte", "bad \uFFFD byte"},
		{"NUL bytes are dropped", "nul\x00here", "nulhere"},
	} {
		got := ErrorText(c.in)
		if got != c.want || len(got) > MaxErrorBytes || !utf8.ValidString(got) {
			t.Errorf("%s: ErrorText gave %d bytes %.40q…, want %d bytes %.40q…", c.name, len(got), got, len(c.want), c.want)
		}
	}
	if v := (&Step{}).ErrorValue(); v != nil {
		t.Errorf("a step without an error binds %v, want nil (NULL)", v)
	}
	if v := (&Step{Error: "boom"}).ErrorValue(); v != "boom" {
		t.Errorf("a step with an error binds %v", v)
	}
}
