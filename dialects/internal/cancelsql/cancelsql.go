// Package cancelsql renders the statements on a cancel-request table that the dialects
// share (dialects.CancelRequestStatements); each dialect gives its CREATE TABLE, its
// quoting and its placeholders.
package cancelsql

import (
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// Statements renders the statements on table q, quoted already, with create as its
// CREATE TABLE. ph is the dialect's placeholder: "?" everywhere, or $1, $2… numbered from
// 1 within each statement.
func Statements(q, create string, ph func(n int) string) dialects.CancelRequestStatements {
	list := func(n int) string {
		out := make([]string, n)
		for i := range out {
			out[i] = ph(i + 1)
		}
		return strings.Join(out, ", ")
	}
	return dialects.CancelRequestStatements{
		Create:  create,
		Request: "INSERT INTO " + q + " (row_id, asker, reason) VALUES (" + list(3) + ")",
		Pending: "SELECT row_id, reason FROM " + q + " WHERE answer IS NULL ORDER BY row_id",
		Answer:  "UPDATE " + q + " SET answer = " + ph(1) + " WHERE row_id = " + ph(2) + " AND answer IS NULL",
		Read:    "SELECT answer FROM " + q + " WHERE row_id = " + ph(1) + " AND asker = " + ph(2),
		Forget:  "DELETE FROM " + q + " WHERE row_id = " + ph(1) + " AND asker = " + ph(2),
	}
}
