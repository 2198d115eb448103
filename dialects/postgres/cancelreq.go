package postgres

import (
	"strconv"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/cancelsql"
)

var _ dialects.CancelRequestSQL = (*Dialect)(nil)

// CancelRequestStatements renders the statements on t's cancel-request table (see
// dialects.CancelRequests); they run through SQLDB.
func (d *Dialect) CancelRequestStatements(t dialects.Table) (dialects.CancelRequestStatements, error) {
	if err := dialects.CheckDescription(t); err != nil {
		return dialects.CancelRequestStatements{}, err
	}
	if err := checkNames(t, ""); err != nil {
		return dialects.CancelRequestStatements{}, err
	}
	q := quote(t.CancelRequests)
	return cancelsql.Statements(q,
		"CREATE TABLE IF NOT EXISTS "+q+" (row_id bigint NOT NULL, asker bigint NOT NULL, reason text NOT NULL, answer text, PRIMARY KEY (row_id, asker))",
		func(n int) string { return "$" + strconv.Itoa(n) }), nil
}
