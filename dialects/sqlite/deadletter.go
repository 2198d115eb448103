package sqlite

import (
	"context"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
)

// catalogQuery lists a table's columns as a move needs them (adminsql.CatalogColumn):
// the name; required (NOT NULL with no default, not generated, and not the rowid: a
// table's only primary key column declared INTEGER, which SQLite fills in); generated
// (hidden 2 or 3 in table_xinfo: a VIRTUAL or STORED generated column).
const catalogQuery = `SELECT c.name,
  c."notnull" = 1 AND c.dflt_value IS NULL AND c.hidden = 0
    AND NOT (c.pk = 1 AND upper(c.type) = 'INTEGER' AND (SELECT count(*) FROM pragma_table_xinfo(?1) AS k WHERE k.pk > 0) = 1),
  c.hidden IN (2, 3)
FROM pragma_table_xinfo(?1) AS c
WHERE c.hidden <> 1
ORDER BY c.cid`

// catalogOf reads a table's columns for a move; none when the table does not exist.
func (d *Dialect) catalogOf(ctx context.Context, table string) ([]adminsql.CatalogColumn, error) {
	return sqlstmt.Catalog(ctx, d.db, catalogQuery, "sqlite", table)
}

// deadLetterColumns checks the dead-letter table dest and returns the columns a
// dead-letter move (or, with requeue, a requeue) copies (adminsql.DeadLetterColumns):
// every column the two tables share, names compared without case as SQLite compares them.
func (d *Dialect) deadLetterColumns(ctx context.Context, t dialects.Table, dest string, requeue bool) ([]adminsql.MoveColumn, error) {
	return adminsql.DeadLetterColumns(ctx, t, dest, true, requeue, d.catalogOf)
}
