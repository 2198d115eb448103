package postgres

import (
	"context"
	"fmt"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

// catalogQuery lists a table's columns as a move needs them (adminsql.CatalogColumn): the
// name; required (NOT NULL, no default, not an identity, not generated); generated
// (GENERATED ALWAYS AS (…) STORED). attidentity and attgenerated are read through
// to_jsonb so the query also runs on servers older than the fields (their columns are
// neither). The table is resolved as columnsQuery resolves it; no rows when it does not
// exist.
const catalogQuery = `SELECT a.attname::text,
  a.attnotnull AND NOT a.atthasdef AND COALESCE(to_jsonb(a) ->> 'attidentity', '') = '' AND COALESCE(to_jsonb(a) ->> 'attgenerated', '') = '',
  COALESCE(to_jsonb(a) ->> 'attgenerated', '') <> ''
FROM pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`

// catalogOf reads a table's columns for a move; none when the table does not exist.
func (d *Dialect) catalogOf(ctx context.Context, table string) ([]adminsql.CatalogColumn, error) {
	rows, err := d.pool.Query(ctx, catalogQuery, quote(table))
	if err != nil {
		return nil, fmt.Errorf("postgres: read the columns of table %s: %w", table, err)
	}
	defer rows.Close()
	var cols []adminsql.CatalogColumn
	for rows.Next() {
		var c adminsql.CatalogColumn
		if err := rows.Scan(&c.Name, &c.Required, &c.Generated); err != nil {
			return nil, fmt.Errorf("postgres: read the columns of table %s: %w", table, err)
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: read the columns of table %s: %w", table, err)
	}
	return cols, nil
}

// deadLetterColumns checks the dead-letter table dest and returns the columns a
// dead-letter move (or, with requeue, a requeue) copies (adminsql.DeadLetterColumns):
// every column the two tables share, by exact name (PostgreSQL compares quoted names with
// their case).
func (d *Dialect) deadLetterColumns(ctx context.Context, t dialects.Table, dest string, requeue bool) ([]adminsql.MoveColumn, error) {
	return adminsql.DeadLetterColumns(ctx, t, dest, false, requeue, d.catalogOf)
}
