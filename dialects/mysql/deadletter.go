package mysql

import (
	"context"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
)

// catalogQuery lists a table's columns as a move needs them (adminsql.CatalogColumn), in
// the pool's current database: the name; required (NOT NULL with no default, not
// auto-increment, not generated); generated (a VIRTUAL or STORED generated column:
// MySQL and MariaDB write "VIRTUAL GENERATED" or "STORED GENERATED" in EXTRA, older
// MariaDB "PERSISTENT"; MySQL's "DEFAULT_GENERATED" is an expression default, not a
// generated column). A column without a default has COLUMN_DEFAULT NULL (MariaDB writes
// the string 'NULL' for a nullable column's NULL default).
const catalogQuery = "SELECT COLUMN_NAME," +
	" IS_NULLABLE = 'NO' AND COLUMN_DEFAULT IS NULL AND EXTRA NOT LIKE '%auto_increment%' AND NOT (" + generatedExtra + ")," +
	" " + generatedExtra +
	" FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION"

const generatedExtra = "EXTRA LIKE '%VIRTUAL GENERATED%' OR EXTRA LIKE '%STORED GENERATED%' OR EXTRA LIKE '%PERSISTENT%'"

// catalogOf reads a table's columns for a move; none when the table does not exist.
func (d *Dialect) catalogOf(ctx context.Context, table string) ([]adminsql.CatalogColumn, error) {
	return sqlstmt.Catalog(ctx, d.db, catalogQuery, "mysql", table)
}

// deadLetterColumns checks the dead-letter table dest and returns the columns a
// dead-letter move (or, with requeue, a requeue) copies (adminsql.DeadLetterColumns):
// every column the two tables share, names compared without case as MySQL compares
// column names.
func (d *Dialect) deadLetterColumns(ctx context.Context, t dialects.Table, dest string, requeue bool) ([]adminsql.MoveColumn, error) {
	return adminsql.DeadLetterColumns(ctx, t, dest, true, requeue, d.catalogOf)
}
