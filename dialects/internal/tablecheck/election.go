package tablecheck

import (
	"fmt"

	"github.com/rowactor/rowactor/dialects"
)

// CheckKeyRange refuses a NewestUniqueKey of a table without a unique key column, or of
// an empty range.
func CheckKeyRange(t dialects.Table, low, high string) error {
	if t.UniqueKey == "" {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.UniqueKey", Reason: "reading unique keys needs the table's unique key column",
			Fix: "set Table.UniqueKey (rowactor.Schema renders it)"}
	}
	if low >= high {
		return fmt.Errorf("dialects: the unique key range [%q, %q) is empty", low, high)
	}
	return nil
}
