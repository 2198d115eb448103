package dialects

import (
	"strings"
	"unicode/utf8"
)

// MaxErrorBytes is how much of a handler's error text the error column (Table.Error)
// keeps: longer text is cut on a UTF-8 character boundary at or below this many bytes.
const MaxErrorBytes = 2000

// ErrorText returns s as the error column stores it: invalid UTF-8 replaced by U+FFFD
// and NUL bytes dropped (PostgreSQL's text refuses both, and the settlement must not
// fail on a handler's message), cut to at most MaxErrorBytes on a character boundary.
func ErrorText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	if len(s) <= MaxErrorBytes {
		return s
	}
	cut := MaxErrorBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// ErrorValue is what a step binds to the error column: nil (NULL) when the outcome
// carried no error, ErrorText of its text otherwise. The statements that return a row
// (retry, retry_after, snooze, dead letter) write COALESCE(value, column), so a retry
// without an error keeps the last one; ack writes the value as is, so an Ack clears it.
func (s *Step) ErrorValue() any {
	if s.Error == "" {
		return nil
	}
	return ErrorText(s.Error)
}

// UncountAttempt renders the count a snooze gives back (col qualified as the statement
// needs): col - 1 above zero, col unchanged at zero and below (and NULL stays NULL), so
// it never goes below zero. A row whose count saturated at its column's maximum
// (CountAttempt) was not counted by its claim, and loses one here: at 32767 attempts
// and more, nobody counts.
func UncountAttempt(col string) string {
	return "CASE WHEN " + col + " > 0 THEN " + col + " - 1 ELSE " + col + " END"
}

// KeepError renders the assignment of a statement that returns or moves a row: the
// outcome's error when it has one (param is its placeholder), the column's own value
// otherwise.
func KeepError(col, param string) string {
	return "COALESCE(" + param + ", " + col + ")"
}
