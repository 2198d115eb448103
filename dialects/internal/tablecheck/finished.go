package tablecheck

import (
	"fmt"

	"github.com/rowactor/rowactor/dialects"
)

// CheckFinished refuses FinishedPerMinute and HasFinishedIndex on a table without
// processed_at.
func CheckFinished(t dialects.Table) error {
	if err := dialects.CheckDescription(t); err != nil {
		return err
	}
	if t.ProcessedAt == "" {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.ProcessedAt",
			Reason: "finished rows are counted by processed_at, and the description names no such column",
			Fix:    "name the processed_at column, or count settlements in the process (a broker's Throughput)"}
	}
	return nil
}

// CheckFinishedGroups refuses a description FinishedGroups cannot read: one without a
// processed_at column or a group column, or a limit that is not positive.
func CheckFinishedGroups(t dialects.Table, limit int) error {
	if err := CheckFinished(t); err != nil {
		return err
	}
	switch {
	case t.Group == "":
		return &dialects.ConfigError{Table: t.Name, Option: "Table.Group",
			Reason: "a table without a group column has no groups to list", Fix: "name the group column"}
	case limit <= 0:
		return &dialects.ConfigError{Table: t.Name, Option: "limit",
			Reason: fmt.Sprintf("limit %d is not positive", limit), Fix: "list at least one group"}
	}
	return nil
}
