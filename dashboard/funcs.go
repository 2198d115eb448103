package dashboard

import (
	"errors"
	"html/template"
	"net/url"
	"time"
)

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"age": roundAge,
	"ms":  func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	// query escapes a value for a URL built as text (printf "/job?table=%s"), such as a
	// form's "back" field. Never in an href: html/template escapes a value there itself,
	// and a value escaped twice names another queue (emails:high as emails%3Ahigh).
	"query": url.QueryEscape,
	"utc":   func(t time.Time) string { return t.UTC().Format(time.DateTime) + " UTC" },
	// dict builds the argument of a sub-template from key, value pairs.
	"dict": func(kv ...any) (map[string]any, error) {
		if len(kv)%2 != 0 {
			return nil, errors.New("dict: odd number of arguments")
		}
		m := make(map[string]any, len(kv)/2)
		for i := 0; i < len(kv); i += 2 {
			k, ok := kv[i].(string)
			if !ok {
				return nil, errors.New("dict: a key is not a string")
			}
			m[k] = kv[i+1]
		}
		return m, nil
	},
}
