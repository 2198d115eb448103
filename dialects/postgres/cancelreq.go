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
		Create:  "CREATE TABLE IF NOT EXISTS " + q + " (row_id bigint NOT NULL, asker bigint NOT NULL, reason text NOT NULL, answer text, PRIMARY KEY (row_id, asker))",
		Request: "INSERT INTO " + q + " (row_id, asker, reason) VALUES ($1, $2, $3)",
		Pending: "SELECT row_id, reason FROM " + q + " WHERE answer IS NULL ORDER BY row_id",
		Answer:  "UPDATE " + q + " SET answer = $1 WHERE row_id = $2 AND answer IS NULL",
		Read:    "SELECT answer FROM " + q + " WHERE row_id = $1 AND asker = $2",
		Forget:  "DELETE FROM " + q + " WHERE row_id = $1 AND asker = $2",
	}, nil
}
