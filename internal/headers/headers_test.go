package headers

import (
	"maps"
	"strings"
	"testing"
)

// TestDecode: strings read as written; values of other types as their JSON text; a column
// that is not an object as nil; each with an error naming what was off.
func TestDecode(t *testing.T) {
	for _, c := range []struct {
		raw     string
		want    map[string]string
		errWant string // "" for no error
	}{
		{``, nil, ""},
		{`null`, nil, ""},
		{` {} `, map[string]string{}, ""},
		{`{"a":"x","b":"\u00e9\"q"}`, map[string]string{"a": "x", "b": "é\"q"}, ""},
		{`{"a":1}`, map[string]string{"a": "1"}, `the header "a" is not a string`},
		{`{"a":1,"b":{"c": 2},"s":"ok"}`, map[string]string{"a": "1", "b": `{"c":2}`, "s": "ok"}, `"a", "b" are not strings`},
		{`{"t":true,"n":null,"l":[1, "x"]}`, map[string]string{"t": "true", "n": "null", "l": `[1,"x"]`}, `"l", "n", "t"`},
		{`{bad`, nil, "not a JSON object ({bad), and are read as none: invalid character"},
		{`[1,2]`, nil, "not a JSON object but an array ([1,2])"},
		{`"text"`, nil, "not a JSON object but a string"},
		{`12`, nil, "not a JSON object but a number"},
		{`{"a":"x"} trailing`, nil, "not a JSON object"},
	} {
		got, err := Decode([]byte(c.raw))
		if !maps.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("Decode(%s) = %#v, want %#v", c.raw, got, c.want)
		}
		switch {
		case c.errWant == "" && err != nil:
			t.Errorf("Decode(%s): %v, want no error", c.raw, err)
		case c.errWant != "" && (err == nil || !strings.Contains(err.Error(), c.errWant)):
			t.Errorf("Decode(%s): %v, want an error with %q", c.raw, err, c.errWant)
		}
	}
}
