package sqlstmt

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

// Catalog reads a table's columns for a dead-letter move (adminsql.CatalogColumn) with
// query, which binds the table's name and returns each column's name, required and
// generated in the table's order; none when the table does not exist. dbName is the
// dialect's name, for errors.
func Catalog(ctx context.Context, db *sql.DB, query, dbName, table string) ([]adminsql.CatalogColumn, error) {
	rows, err := db.QueryContext(ctx, query, table)
	if err != nil {
		return nil, fmt.Errorf("%s: read the columns of table %s: %w", dbName, table, err)
	}
	defer rows.Close()
	var cols []adminsql.CatalogColumn
	for rows.Next() {
		var c adminsql.CatalogColumn
		if err := rows.Scan(&c.Name, &c.Required, &c.Generated); err != nil {
			return nil, fmt.Errorf("%s: read the columns of table %s: %w", dbName, table, err)
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: read the columns of table %s: %w", dbName, table, err)
	}
	return cols, nil
}
