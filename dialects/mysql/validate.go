package mysql

import (
	"context"
	"fmt"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/internal/tablecheck"
)

// columnsOf lists a table's columns in the pool's current database; none when the table
// does not exist. The server compares the table name as it compares table names
// (lower_case_table_names), column names always without case.
func (d *Dialect) columnsOf(ctx context.Context, table string) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT COLUMN_NAME FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION", table)
	if err != nil {
		return nil, fmt.Errorf("mysql: read the columns of table %s: %w", table, err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("mysql: read the columns of table %s: %w", table, err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysql: read the columns of table %s: %w", table, err)
	}
	return names, nil
}

// checkNames refuses identifiers MySQL would refuse for their length, before any SQL
// names them.
func checkNames(t dialects.Table, deadLetterTable string) error {
	if utf8.RuneCountInString(t.Name) > maxIdentifier {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.Name",
			Reason: fmt.Sprintf("MySQL names are at most %d characters", maxIdentifier),
			Fix:    "rename the table"}
	}
	for _, c := range t.Columns() {
		if utf8.RuneCountInString(c.Name) > maxIdentifier {
			return &dialects.ConfigError{Table: t.Name, Column: c.Name, Option: "Table." + c.Role,
				Reason: fmt.Sprintf("MySQL names are at most %d characters", maxIdentifier),
				Fix:    "rename the column"}
		}
	}
	if utf8.RuneCountInString(t.CancelRequests) > maxIdentifier {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.CancelRequests",
			Reason: fmt.Sprintf("cancel-request table %q: MySQL names are at most %d characters", t.CancelRequests, maxIdentifier),
			Fix:    "rename the cancel-request table"}
	}
	if utf8.RuneCountInString(deadLetterTable) > maxIdentifier {
		return &dialects.ConfigError{Table: t.Name, Option: "DeadLetterTable",
			Reason: fmt.Sprintf("dead-letter table %q: MySQL names are at most %d characters", deadLetterTable, maxIdentifier),
			Fix:    "rename the dead-letter table"}
	}
	return nil
}

// checkDescription refuses what MySQL cannot serve whatever the live table holds.
func checkDescription(t dialects.Table) error {
	if err := dialects.CheckDescription(t); err != nil {
		return err
	}
	if err := checkNames(t, ""); err != nil {
		return err
	}
	if t.Mode != "" {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.Mode",
			Reason: fmt.Sprintf("%q is an SQLite transaction mode; MySQL declares an isolation level instead", t.Mode),
			Fix:    "drop Mode and set Table.Isolation (ReadUncommitted, ReadCommitted, RepeatableRead or Serializable) if needed"}
	}
	return nil
}

// checkTable refuses a description the live table cannot serve for publishing.
func (d *Dialect) checkTable(ctx context.Context, t dialects.Table) error {
	if err := checkDescription(t); err != nil {
		return err
	}
	if err := d.checkServer(ctx, t.Name); err != nil {
		return err
	}
	have, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return err
	}
	// MySQL compares column names without case.
	return tablecheck.CheckColumns(t, have, true)
}

// checkSpec refuses a subscription MySQL cannot serve, before anything is claimed. It
// returns the columns a dead-letter move copies, when the dead letter is a table.
func (d *Dialect) checkSpec(ctx context.Context, spec dialects.QueueSpec) ([]adminsql.MoveColumn, error) {
	t := spec.Table
	if err := checkDescription(t); err != nil {
		return nil, err
	}
	if err := checkNames(t, spec.DeadLetterTable); err != nil {
		return nil, err
	}
	if err := checkFIFO(t); err != nil {
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
	if err := d.checkServer(ctx, t.Name); err != nil {
		return nil, err
	}
	if err := d.checkForm(t); err != nil {
		return nil, err
	}
	have, err := d.columnsOf(ctx, t.Name)
	if err != nil {
		return nil, err
	}
	if err := tablecheck.CheckColumns(t, have, true); err != nil {
		return nil, err
	}
	if spec.DeadLetterTable != "" {
		return d.deadLetterColumns(ctx, t, spec.DeadLetterTable, false)
	}
	return nil, nil
}

// checkForm refuses the row lock and advisory forms on a Galera node: their locks (FOR
// UPDATE, GET_LOCK) are the node's own and never reach the other nodes, so a consumer on
// each node could run the same row's handler at once. A lease is a committed row version,
// which certification orders across the cluster.
//
// FIFO is refused in every form: its group guard (a locking read of the group's rows) and
// the lease form's test for a leased row of the group are reads, which certification does
// not order. Two nodes whose views differ (a row with a lower id committed on one node
// after the other's claim read the group: ids drawn on two nodes are not in commit order)
// each take a different row of one group; the two claims write different rows, and both
// commit.
func (d *Dialect) checkForm(t dialects.Table) error {
	if d.cluster && t.FIFO {
		return &dialects.ConfigError{Table: t.Name, Option: "Table.FIFO",
			Reason: "the server is a Galera cluster node (wsrep_on = ON): a FIFO claim keeps a group to one row in work by reads " +
				"(a locking read of the group's rows, a test for a leased row of the group) that hold on one node only, so consumers " +
				"on two nodes could each take a row of the same group",
			Fix: "drop Table.FIFO on a cluster (order the work inside the handler), or keep FIFO tables on a server that is not a cluster node"}
	}
	if !d.cluster || t.Form() == dialects.FormLease {
		return nil
	}
	option := "Table (row lock form)"
	if t.Form() == dialects.FormAdvisory {
		option = "Table.AdvisoryKey"
	}
	return &dialects.ConfigError{Table: t.Name, Option: option,
		Reason: "the server is a Galera cluster node (wsrep_on = ON): row locks and GET_LOCK hold on one node only, so consumers on two nodes could handle the same row at once",
		Fix: "use the lease form: set Table.LockedUntil (and drop AdvisoryKey); batch handlers (SubscribeBatch) " +
			"serve the row lock form only, so on a cluster handle rows one at a time with Subscribe"}
}
