package postgres

import "github.com/rowactor/rowactor/dialects"

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
	return dialects.CancelRequestStatements{
		Create:  "CREATE TABLE IF NOT EXISTS " + q + " (row_id bigint PRIMARY KEY, reason text NOT NULL, answer text)",
		Request: "INSERT INTO " + q + " (row_id, reason) VALUES ($1, $2) ON CONFLICT (row_id) DO UPDATE SET reason = EXCLUDED.reason, answer = NULL",
		Pending: "SELECT row_id, reason FROM " + q + " WHERE answer IS NULL ORDER BY row_id",
		Answer:  "UPDATE " + q + " SET answer = $1 WHERE row_id = $2",
		Read:    "SELECT answer FROM " + q + " WHERE row_id = $1",
		Forget:  "DELETE FROM " + q + " WHERE row_id = $1",
	}, nil
}
