package postgres

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor/dialects"
)

// Culprit reads the table, column and constraint PostgreSQL names in an error's fields
// (a check, not-null, unique or foreign key violation names them; a trigger's RAISE
// names none).
func (d *Dialect) Culprit(err error) dialects.Culprit {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return dialects.Culprit{}
	}
	return dialects.Culprit{Table: pe.TableName, Column: pe.ColumnName, Constraint: pe.ConstraintName}
}
