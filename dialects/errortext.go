package dialects

import (
	"strings"
	"unicode/utf8"
)

// MaxErrorBytes is how much of a handler's error text the error column, Table.Error,
// keeps. Longer text is cut on a UTF-8 character boundary at or below this many bytes.
const MaxErrorBytes = 2000

// ErrorText returns s as the error column stores it:
//
//   - invalid UTF-8 replaced by U+FFFD, and NUL bytes dropped. PostgreSQL's text refuses
//     both, and the settlement must not fail on a handler's message;
//   - cut to at most MaxErrorBytes on a character boundary.
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

// ErrorValue is what a step binds to the error column: nil, for NULL, when the outcome
// carried no error, and ErrorText of its text otherwise.
//
// The statements that return a row, retry, retry_after, snooze and dead letter, write
// COALESCE(value, column), so a retry without an error keeps the last one. Ack writes
// the value as is, so an Ack clears it.
func (s *Step) ErrorValue() any {
	if s.Error == "" {
		return nil
	}
	return ErrorText(s.Error)
}

// CancelledPrefix starts the error column of every row a cancellation ended: the outcome
// Cancel and Broker.Cancel both write CancelledError(reason). A row kept with processed_at
// whose error starts with it reads as JobCancelled, and Stats' most frequent errors leave
// it out: a cancellation's reason is no failure.
const CancelledPrefix = "cancelled: "

// CancelledError is the error column's text of a row cancelled for reason.
func CancelledError(reason string) string { return CancelledPrefix + reason }
