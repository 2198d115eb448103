package mysql

import (
	"errors"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
)

// Classify names an error's fault by the server's error number, or by the driver's own
// sentinel for a connection it found broken.
func (d *Dialect) Classify(err error) dialects.Fault {
	return classify(err)
}

func classify(err error) dialects.Fault {
	if errors.Is(err, mysql.ErrInvalidConn) {
		return dialects.FaultConnection
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return classifyNumber(me.Number)
	}
	return dialects.ClassifyNetwork(err)
}

// classifyNumber maps a server error number
// (https://mariadb.com/kb/en/mariadb-error-code-reference/).
func classifyNumber(n uint16) dialects.Fault {
	switch n {
	case 1040, // ER_CON_COUNT_ERROR: too many connections
		1053,       // ER_SERVER_SHUTDOWN
		1927,       // ER_CONNECTION_KILLED (MariaDB)
		2006, 2013: // CR_SERVER_GONE_ERROR, CR_SERVER_LOST
		return dialects.FaultConnection
	case errLockWaitTimeout, errDeadlock,
		3572: // ER_LOCK_NOWAIT (MySQL 8)
		return dialects.FaultContention
	case 1044, 1045, 1049, // access denied to the database, bad password, unknown database
		1054,       // ER_BAD_FIELD_ERROR: unknown column
		1142, 1143, // table or column access denied
		1146: // ER_NO_SUCH_TABLE
		return dialects.FaultSchema
	case 1048, // ER_BAD_NULL_ERROR: a NOT NULL column given NULL
		1062,       // ER_DUP_ENTRY
		1264,       // ER_WARN_DATA_OUT_OF_RANGE: out of range for the column (strict mode)
		1265,       // WARN_DATA_TRUNCATED
		1292,       // ER_TRUNCATED_WRONG_VALUE: an incorrect value (e.g. a datetime)
		1366,       // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD: an incorrect value for the column's type
		1367,       // ER_ILLEGAL_VALUE_FOR_TYPE
		1406,       // ER_DATA_TOO_LONG
		1451, 1452, // ER_ROW_IS_REFERENCED_2, ER_NO_REFERENCED_ROW_2: a foreign key
		1690, // ER_DATA_OUT_OF_RANGE: an expression out of its type's range
		3140, // ER_INVALID_JSON_TEXT (MySQL)
		3819, // ER_CHECK_CONSTRAINT_VIOLATED (MySQL)
		4025: // ER_CONSTRAINT_FAILED: a CHECK constraint (MariaDB)
		// A value one row holds, or one a statement writes into it.
		return dialects.FaultData
	}
	return dialects.FaultUnknown
}
