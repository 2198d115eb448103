package dashboard

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds of what a job page shows of a row: whatever the row holds, the page stays a few
// hundred KB. Indenting JSON as it stands would not be bounded by the payload's size: a
// 20 KB payload nested 9,999 deep indents to 200 MB.
const (
	// previewBytes is the most a payload's JSON or text preview shows.
	previewBytes = 64 << 10
	// previewIndent is the deepest nesting a JSON preview indents further; deeper
	// levels are drawn at this indent.
	previewIndent = 32
	// hexPreviewBytes is how many bytes of a payload that is neither JSON nor text the
	// page shows in hex (a hex dump is about 4.2 times its bytes).
	hexPreviewBytes = 1024
	// errorPreviewBytes is the most of the error column the job page shows.
	errorPreviewBytes = 16 << 10
	// headerPreviewBytes is the most of one header's value the page shows, and
	// headersShown the most headers.
	headerPreviewBytes = 1024
	headersShown       = 100
)

// preview is what the job page shows of a payload: indented JSON, text, or a hex dump,
// cut to its bound.
type preview struct {
	Text string
	Kind string // "JSON", "text" or "hex"
	Cut  bool   // Text shows only the payload's first bytes
}

// payloadPreview is p as the job page shows it: JSON indented (previewBytes at most),
// else valid UTF-8 text without control characters but line breaks and tabs as text
// (previewBytes at most), else its first hexPreviewBytes in hex.
func payloadPreview(p []byte) preview {
	if json.Valid(p) {
		text, cut := indentJSON(p, previewBytes)
		return preview{Text: text, Kind: "JSON", Cut: cut}
	}
	if isText(p) {
		text, cut := cutText(string(p), previewBytes)
		return preview{Text: text, Kind: "text", Cut: cut}
	}
	return preview{Text: hex.Dump(p[:min(len(p), hexPreviewBytes)]), Kind: "hex", Cut: len(p) > hexPreviewBytes}
}

// isText says p is valid UTF-8 whose only control characters are line breaks and tabs.
func isText(p []byte) bool {
	if !utf8.Valid(p) {
		return false
	}
	for _, r := range string(p) {
		if unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
	}
	return true
}

// cutText is s cut to at most n bytes on a character's boundary, and whether it was cut.
func cutText(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// indentJSON indents valid JSON src as json.Indent(dst, src, "", "  ") does, but stops
// once it has written limit bytes (cut reports it) and indents no deeper than
// previewIndent levels: its output is bounded by limit, not by src's nesting.
func indentJSON(src []byte, limit int) (out string, cut bool) {
	var (
		b        bytes.Buffer
		depth    int
		inString bool
		escaped  bool
	)
	newline := func(d int) {
		b.WriteByte('\n')
		b.WriteString(strings.Repeat("  ", min(max(d, 0), previewIndent)))
	}
	for i := 0; i < len(src); i++ {
		if b.Len() >= limit {
			return b.String(), true
		}
		c := src[i]
		if inString {
			b.WriteByte(c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
		case '"':
			inString = true
			b.WriteByte(c)
		case '{', '[':
			// An empty object or array stays on its line, as json.Indent writes it.
			j := i + 1
			for j < len(src) && (src[j] == ' ' || src[j] == '\t' || src[j] == '\n' || src[j] == '\r') {
				j++
			}
			if j < len(src) && (src[j] == '}' || src[j] == ']') {
				b.WriteByte(c)
				b.WriteByte(src[j])
				i = j
				continue
			}
			b.WriteByte(c)
			depth++
			newline(depth)
		case '}', ']':
			depth--
			newline(depth)
			b.WriteByte(c)
		case ',':
			b.WriteByte(c)
			newline(depth)
		case ':':
			b.WriteString(": ")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), false
}
