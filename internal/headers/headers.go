// Package headers reads a queue row's headers column, the one way every reader in rowactor
// does (a delivery's Headers, its span's trace context, the outbox relay, the CLI's stats).
package headers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Decode reads a headers column: a JSON object of strings. It reads what it can, and its
// error says what it could not read as written:
//
//   - a value that is not a string reads as its JSON text: {"n":1} reads as n="1", and
//     {"a":{"b":2}} as a=`{"b":2}` (compacted); null reads as "null";
//   - a column that is not a JSON object ({bad, [1,2], "text") reads as nil.
//
// An empty column, and JSON null, read as nil with no error: the row has no headers.
func Decode(raw []byte) (map[string]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, nil
	}
	var values map[string]json.RawMessage
	if err := json.Unmarshal(raw, &values); err != nil {
		if !json.Valid(raw) {
			return nil, fmt.Errorf("the headers are not a JSON object (%s), and are read as none: %w", clip(raw), err)
		}
		return nil, fmt.Errorf("the headers are not a JSON object but %s (%s), and are read as none", kind(raw[0]), clip(raw))
	}
	if values == nil {
		return nil, nil
	}
	out := make(map[string]string, len(values))
	var notStrings []string
	for k, v := range values {
		if len(v) > 0 && v[0] == '"' {
			var s string
			if err := json.Unmarshal(v, &s); err == nil {
				out[k] = s
				continue
			}
		}
		var b bytes.Buffer
		if err := json.Compact(&b, v); err != nil {
			b.Reset()
			b.Write(v) // unreachable: the object parsed, so each value is valid JSON
		}
		out[k] = b.String()
		notStrings = append(notStrings, k)
	}
	if len(notStrings) > 0 {
		slices.Sort(notStrings)
		for i, k := range notStrings {
			notStrings[i] = fmt.Sprintf("%q", k)
		}
		if len(notStrings) == 1 {
			return out, fmt.Errorf("the header %s is not a string, and is read as its JSON text", notStrings[0])
		}
		return out, fmt.Errorf("the headers %s are not strings, and are read as their JSON text", strings.Join(notStrings, ", "))
	}
	return out, nil
}

// kind names the JSON value that starts with c, one that is not an object or null.
func kind(c byte) string {
	switch c {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	default:
		return "a number"
	}
}

// clip is raw for an error message, cut short when long.
func clip(raw []byte) string {
	const max = 64
	if len(raw) <= max {
		return string(raw)
	}
	return string(raw[:max]) + "…"
}
