package mysql

import (
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/cancelsql"
)

var _ dialects.CancelRequestSQL = (*Dialect)(nil)

// CancelRequestStatements renders the statements on t's cancel-request table (see
// dialects.CancelRequests); they run through SQLDB.
func (d *Dialect) CancelRequestStatements(t dialects.Table) (dialects.CancelRequestStatements, error) {
	if err := checkDescription(t); err != nil {
		return dialects.CancelRequestStatements{}, err
	}
	q := quote(t.CancelRequests)
	return cancelsql.Statements(q,
		"CREATE TABLE IF NOT EXISTS "+q+" (row_id BIGINT NOT NULL, asker BIGINT NOT NULL, reason TEXT NOT NULL, answer VARCHAR(16) NULL,"+
			" PRIMARY KEY (row_id, asker)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
		func(int) string { return "?" }), nil
}
