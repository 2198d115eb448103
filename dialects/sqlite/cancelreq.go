package sqlite

import "github.com/rowactor/rowactor/dialects"

var _ dialects.CancelRequestSQL = (*Dialect)(nil)

// CancelRequestStatements renders the statements on t's cancel-request table (see
// dialects.CancelRequests); they run through SQLDB.
func (d *Dialect) CancelRequestStatements(t dialects.Table) (dialects.CancelRequestStatements, error) {
	if err := dialects.CheckDescription(t); err != nil {
		return dialects.CancelRequestStatements{}, err
	}
	q := quote(t.CancelRequests)
	return dialects.CancelRequestStatements{
		Create:  "CREATE TABLE IF NOT EXISTS " + q + " (row_id INTEGER NOT NULL, asker INTEGER NOT NULL, reason TEXT NOT NULL, answer TEXT, PRIMARY KEY (row_id, asker))",
		Request: "INSERT INTO " + q + " (row_id, asker, reason) VALUES (?, ?, ?)",
		Pending: "SELECT row_id, reason FROM " + q + " WHERE answer IS NULL ORDER BY row_id",
		Answer:  "UPDATE " + q + " SET answer = ? WHERE row_id = ? AND answer IS NULL",
		Read:    "SELECT answer FROM " + q + " WHERE row_id = ? AND asker = ?",
		Forget:  "DELETE FROM " + q + " WHERE row_id = ? AND asker = ?",
	}, nil
}
