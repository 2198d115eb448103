package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// checkOutboxIDs refuses an outbox table whose ids the server can hand out again: a
// consumer's Dedupe would take a new record for a purged one with its id and skip its
// effect.
//
// The id must be AUTO_INCREMENT: anything else is filled by what the service runs (a
// trigger taking MAX(id)+1 reuses the ids of purged records). The table must be InnoDB.
// InnoDB keeps its counter across restarts on every server rowactor supports (MySQL 8.0+,
// WL#6204; MariaDB since 10.2.4, MDEV-6076), where older servers set it to MAX(id)+1 at
// start, and it is transactional: MyISAM or Aria would keep a record whose transaction
// rolled back, and MEMORY starts its counter again after a restart. What no check at start
// can see: TRUNCATE and ALTER TABLE … AUTO_INCREMENT on an emptied table set the counter
// back, and innodb_flush_log_at_trx_commit other than 1 can lose the last commits, and the
// counter with them, in a crash; docs/outbox.md says to avoid them.
func (d *Dialect) checkOutboxIDs(ctx context.Context, t dialects.OutboxTable) error {
	const why = ": consumers recognise a record sent twice by its id, and a Dedupe would take a new record " +
		"for a purged one with a reused id and skip its effect"
	var engine sql.NullString
	err := d.db.QueryRowContext(ctx, "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
		t.Name).Scan(&engine)
	if errors.Is(err, sql.ErrNoRows) {
		return &dialects.ConfigError{Table: t.Name, Reason: "the table does not exist", Fix: "create it first (outbox.Schema renders its CREATE TABLE)"}
	}
	if err != nil {
		return fmt.Errorf("mysql: read the engine of table %s: %w", t.Name, err)
	}
	if !strings.EqualFold(engine.String, "InnoDB") {
		name := engine.String
		if !engine.Valid {
			name = "no engine (a view)"
		}
		return &dialects.ConfigError{Table: t.Name, Option: "outbox.Table.Name",
			Reason: fmt.Sprintf("the table's engine is %s, not InnoDB: it may reuse the ids of purged records after a restart "+
				"(MEMORY starts its counter again), and a non-transactional engine keeps a record whose transaction rolled back%s", name, why),
			Fix: fmt.Sprintf("ALTER TABLE %s ENGINE=InnoDB (outbox.Schema renders an InnoDB table)", quote(t.Name))}
	}
	var extra, typ string
	err = d.db.QueryRowContext(ctx, "SELECT EXTRA, COLUMN_TYPE FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?", t.Name, t.ID).Scan(&extra, &typ)
	if errors.Is(err, sql.ErrNoRows) {
		return &dialects.ConfigError{Table: t.Name, Column: t.ID, Option: "outbox.Table.ID", Reason: "the table has no such column",
			Fix: "add the column to the table (outbox.Schema renders it), or correct Table.ID"}
	}
	if err != nil {
		return fmt.Errorf("mysql: read the id column of table %s: %w", t.Name, err)
	}
	if !strings.Contains(strings.ToLower(extra), "auto_increment") {
		return &dialects.ConfigError{Table: t.Name, Column: t.ID, Option: "outbox.Table.ID",
			Reason: "the id column is not AUTO_INCREMENT, so nothing keeps the ids of purged records from being reused" + why,
			Fix: fmt.Sprintf("ALTER TABLE %s MODIFY %s %s NOT NULL AUTO_INCREMENT, AUTO_INCREMENT = <above the highest id ever handed out> "+
				"(outbox.Schema renders the table)", quote(t.Name), quote(t.ID), typ)}
	}
	return nil
}
