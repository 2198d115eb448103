package tablecheck

import (
	"fmt"

	"github.com/rowactor/rowactor/dialects"
)

// CheckFIFO refuses FIFO groups a description cannot have: a group needs a group column
// to be a group, and the advisory lock form orders rows by key, not by group. Dialects
// call it from Open, whatever else they serve.
func CheckFIFO(t dialects.Table) error {
	if !t.FIFO {
		return nil
	}
	if t.Form() == dialects.FormAdvisory {
		key := "{" + t.Group + "}"
		if t.Group == "" {
			key = "{<group column>}"
		}
		return &dialects.ConfigError{Table: t.Name, Option: "Table.FIFO",
			Reason: "the advisory lock form works the rows of one key one at a time; it has no FIFO groups",
			Fix:    "put the group into the advisory key (e.g. AdvisoryKey: \"" + t.Name + "-" + key + "\") and drop FIFO, or use the row lock or lease form"}
	}
	if t.Group == "" {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.FIFO", Reason: "FIFO orders each group, and the description names no group column",
			Fix: "set Table.Group to the table's group column, or drop FIFO"}
	}
	return nil
}

// CheckPriorityFits refuses a priority the priority column cannot hold: lo and hi are the
// column's range, typ its type as the catalog names it. A database would clamp the value
// (MySQL without strict mode) or fail with an error that names neither (pgx's encoder).
func CheckPriorityFits(n int, lo, hi int64, typ string) error {
	if int64(n) < lo || int64(n) > hi {
		return fmt.Errorf("priority %d does not fit the priority column (%s: %d to %d); publish a priority in that range, "+
			"or widen the column to a bigint", n, typ, lo, hi)
	}
	return nil
}

// Maxima of the integer column types an attempt column may have.
const (
	MaxSmallint int64 = 32767
	MaxInteger  int64 = 2147483647
	MaxBigint   int64 = 9223372036854775807
)
