package sqlite

import (
	"context"
	"fmt"
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// catalogQuery lists a table's columns as a move needs them (dialects.CatalogColumn):
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
func (d *Dialect) catalogOf(ctx context.Context, table string) ([]dialects.CatalogColumn, error) {
	rows, err := d.db.QueryContext(ctx, catalogQuery, table)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
	}
	defer rows.Close()
	var cols []dialects.CatalogColumn
	for rows.Next() {
		var c dialects.CatalogColumn
		if err := rows.Scan(&c.Name, &c.Required, &c.Generated); err != nil {
			return nil, fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
	}
	return cols, nil
}

// deadLetterColumns checks the dead-letter table dest against the queue table's
// description and both tables' catalogs, and returns the columns a dead-letter move (or,
// with requeue, a requeue) copies: every column the two tables share, names compared
// without case as SQLite compares them.
func (d *Dialect) deadLetterColumns(ctx context.Context, t dialects.Table, dest string, requeue bool) ([]dialects.MoveColumn, error) {
	if err := dialects.CheckDeadLetterName(t, dest); err != nil {
		return nil, err
	}
	queue, err := d.catalogOf(ctx, t.Name)
	if err != nil {
		return nil, err
	}
	dead, err := d.catalogOf(ctx, dest)
	if err != nil {
		return nil, err
	}
	return dialects.MoveColumns(t, dest, queue, dead, true, requeue)
}

// moveLists renders a move's INSERT column list (the destination's names) and its SELECT
// list (the source's names, or the value value gives a column's role instead).
func moveLists(cols []dialects.MoveColumn, requeue bool, value func(dialects.MoveColumn) string) (into, sel string) {
	names, values := make([]string, len(cols)), make([]string, len(cols))
	for i, c := range cols {
		from, to := c.Name, c.DeadName
		if requeue {
			from, to = c.DeadName, c.Name
		}
		names[i] = quote(to)
		values[i] = quote(from)
		if v := value(c); v != "" {
			values[i] = v
		}
	}
	return strings.Join(names, ", "), strings.Join(values, ", ")
}
