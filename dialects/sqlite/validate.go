package sqlite

import (
	"context"
	"fmt"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// columnsOf lists a table's columns; none when the table does not exist.
func (d *Dialect) columnsOf(ctx context.Context, table string) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT name FROM pragma_table_info(?)", table)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
	}
	return names, nil
}

// checkTable refuses a description the live table cannot serve for publishing: the
// checks every use of the table shares.
func (d *Dialect) checkTable(ctx context.Context, t dialects.Table) error {
	if err := dialects.CheckDescription(t); err != nil {
		return err
	}
	have, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return err
	}
	// SQLite folds ASCII case in names.
	return tablecheck.CheckColumns(t, have, true)
}

// checkSpec refuses a subscription SQLite cannot serve, before anything is claimed. It
// returns the columns a dead-letter move copies, when the dead letter is a table.
func (d *Dialect) checkSpec(ctx context.Context, spec dialects.QueueSpec) ([]adminsql.MoveColumn, error) {
	t := spec.Table
	if err := dialects.CheckDescription(t); err != nil {
		return nil, err
	}
	if err := refuseRowLock(t); err != nil {
		return nil, err
	}
	if err := tablecheck.CheckFIFO(t); err != nil {
		return nil, err
	}
	if t.Isolation != "" {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "Table.Isolation",
			Reason: fmt.Sprintf("SQLite has no isolation level %q to open (its transactions are serializable)", t.Isolation),
			Fix:    "drop Isolation and set Table.Mode (Deferred, Immediate or Exclusive) instead"}
	}
	have, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return nil, err
	}
	if err := tablecheck.CheckColumns(t, have, true); err != nil {
		return nil, err
	}
	if spec.DeadLetterGroup != "" && spec.DeadLetterTable != "" {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: "a dead letter is a group or a table, not both",
			Fix:    "keep DeadLetterGroup or DeadLetterTable"}
	}
	if spec.DeadLetterGroup != "" && t.Group == "" {
		return nil, &dialects.ConfigError{Table: t.Name, Option: "DeadLetterGroup",
			Reason: "a dead-letter group needs a group column, and the description names none",
			Fix:    "set Table.Group to the table's group column, or dead-letter to a table (DeadLetterTable)"}
	}
	if spec.DeadLetterTable != "" {
		return d.deadLetterColumns(ctx, t, spec.DeadLetterTable, false)
	}
	return nil, nil
}

// refuseRowLock refuses the row lock form (no LockedUntil, no AdvisoryKey), which SQLite
// cannot serve: no subscription consumes a table so described, so a change made through
// such a description would skip the fence of the form the table's consumers use.
func refuseRowLock(t dialects.Table) error {
	if t.Form() != dialects.FormRowLock {
		return nil
	}
	return &dialects.ConfigError{Table: t.Name, Option: "Table.LockedUntil",
		Reason: "SQLite has no row locks, so it cannot serve the row lock form",
		Fix:    "add a LockedUntil column for the lease form, or an AdvisoryKey for the advisory form"}
}
