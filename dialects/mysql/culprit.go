package mysql

import (
	"errors"
	"regexp"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
)

// The server names a culprit only in its message text.
var (
	// ER_CONSTRAINT_FAILED (MariaDB 4025): CONSTRAINT `name` failed for `db`.`table`;
	// ER_CHECK_CONSTRAINT_VIOLATED (MySQL 3819): Check constraint 'name' is violated.
	constraintText = regexp.MustCompile("(?i)constraint [`']((?:[^`']|``)+)[`']")
	// ER_BAD_NULL_ERROR: Column 'x' cannot be null; ER_NO_DEFAULT_FOR_FIELD: Field 'x'
	// doesn't have a default value; ER_DATA_TOO_LONG and ER_WARN_DATA_OUT_OF_RANGE: … for
	// column 'x' at row 1; MariaDB's incorrect values: … for column `db`.`t`.`x` at row 1.
	columnText = regexp.MustCompile("(?i)(?:column|field) (?:`[^`]*`\\.)*[`']((?:[^`']|``)+)[`']")
)

// Culprit reads the constraint or column a MySQL or MariaDB error names in its message.
func (d *Dialect) Culprit(err error) dialects.Culprit {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return dialects.Culprit{}
	}
	var c dialects.Culprit
	if m := constraintText.FindStringSubmatch(me.Message); m != nil {
		c.Constraint = m[1]
	} else if m := columnText.FindStringSubmatch(me.Message); m != nil {
		c.Column = m[1]
	}
	return c
}
