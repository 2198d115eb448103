package sqlstmt

import (
	"database/sql"

	"github.com/rowactor/rowactor/dialects"
)

// Unreadable names a claimed row whose columns did not scan (scanErr) on the current row
// of rows, whose first column is the id: it reads the id alone and returns the row flagged
// with a *dialects.RowDataError, so that the claim goes on with the rows beside it and
// the runtime sets this one aside. A row whose id cannot be read either cannot be named:
// its *dialects.RowDataError is returned as the claim's error.
func Unreadable(rows *sql.Rows, table string, scanErr error) (dialects.Row, error) {
	cols, err := rows.Columns()
	if err != nil || len(cols) == 0 {
		return dialects.Row{}, &dialects.RowDataError{Table: table, Err: scanErr}
	}
	var id int64
	dest := make([]any, len(cols))
	dest[0] = &id
	for i := 1; i < len(dest); i++ {
		dest[i] = new(any)
	}
	// database/sql converts the current row's values again on each Scan.
	if err := rows.Scan(dest...); err != nil {
		return dialects.Row{}, &dialects.RowDataError{Table: table, Err: scanErr}
	}
	return dialects.Row{ID: id, Fault: &dialects.RowDataError{Table: table, ID: id, Err: scanErr}}, nil
}
