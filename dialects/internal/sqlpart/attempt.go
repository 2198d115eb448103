package sqlpart

import (
	"strconv"
)

// CountAttempt renders the saturating count of an attempt column (col, qualified as the
// statement needs): col + 1 below max, col unchanged at max and above (and NULL stays
// NULL). The sum is computed only below max, so it never overflows the column's type.
// A statement that reads the counted value back less one (an UPDATE … RETURNING) cannot
// tell a row it moved to max from one that was there: at the cap such a delivery reads
// max - 1.
func CountAttempt(col string, max int64) string {
	return "CASE WHEN " + col + " < " + strconv.FormatInt(max, 10) + " THEN " + col + " + 1 ELSE " + col + " END"
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
