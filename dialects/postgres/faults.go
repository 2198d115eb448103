package postgres

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rowactor/rowactor/dialects"
)

// Classify names an error's fault by its SQLSTATE class, or by pgconn's own error types
// for failures below SQL (a refused connection, a closed socket).
func (d *Dialect) Classify(err error) dialects.Fault {
	return classify(err)
}

func classify(err error) dialects.Fault {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return classifyState(pe.Code)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return dialects.FaultConnection
	}
	// SafeToRetry marks errors where nothing reached the server: a connection pgx already
	// knew was closed or broken.
	if pgconn.SafeToRetry(err) {
		return dialects.FaultConnection
	}
	return dialects.ClassifyNetwork(err)
}

// classifyState maps a SQLSTATE (https://www.postgresql.org/docs/current/errcodes-appendix.html).
func classifyState(code string) dialects.Fault {
	switch code {
	case "57P01", "57P02", "57P03", // admin_shutdown (pg_terminate_backend, a fast stop), crash_shutdown, cannot_connect_now
		"53300": // too_many_connections
		return dialects.FaultConnection
	case "40001", "40P01", "55P03": // serialization_failure, deadlock_detected, lock_not_available
		return dialects.FaultContention
	case "42P01", "42703", "42501", "3F000", "3D000", "42883": // undefined table/column, insufficient privilege, invalid schema/catalog, undefined function
		return dialects.FaultSchema
	}
	if len(code) == 5 && code[:2] == "08" { // connection_exception
		return dialects.FaultConnection
	}
	if len(code) == 5 && (code[:2] == "22" || code[:2] == "23") {
		// data_exception (a value out of range, of the wrong type, too long) and
		// integrity_constraint_violation (a check, not-null, unique or foreign key
		// constraint): a value one row holds, or one a statement writes into it.
		return dialects.FaultData
	}
	return dialects.FaultUnknown
}
