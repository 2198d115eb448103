package mysql

import (
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// TestCatalogColumns: the catalog tells a column an INSERT must give a value (NOT NULL
// without a default, not auto-increment, not generated) and a column it cannot write
// (a virtual or stored generated column); an expression default is a default.
func TestCatalogColumns(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d, "dlcat")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(name)+` (
		id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		customer VARCHAR(100) NOT NULL,
		Mixed VARCHAR(100) NOT NULL DEFAULT '',
		amount DECIMAL(12,2),
		born DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		customer_key VARCHAR(100) AS (LOWER(customer)) VIRTUAL,
		customer_len INT AS (CHAR_LENGTH(customer)) STORED)`)
	dialecttest.CatalogColumns(t, d.catalogOf, name,
		"[{id false false} {customer true false} {Mixed false false} {amount false false} {born false false} {customer_key false true} {customer_len false true}]")
}

// TestCulprit: the constraint or column a server error names in its message.
func TestCulprit(t *testing.T) {
	for _, c := range []struct {
		number  uint16
		message string
		want    dialects.Culprit
	}{
		{4025, "CONSTRAINT `jobs_dead_refuses` failed for `test`.`jobs_dead`", dialects.Culprit{Constraint: "jobs_dead_refuses"}},
		{3819, "Check constraint 'jobs_dead_refuses' is violated.", dialects.Culprit{Constraint: "jobs_dead_refuses"}},
		{1048, "Column 'customer' cannot be null", dialects.Culprit{Column: "customer"}},
		{1364, "Field 'approver' doesn't have a default value", dialects.Culprit{Column: "approver"}},
		{1406, "Data too long for column 'customer' at row 1", dialects.Culprit{Column: "customer"}},
		{1366, "Incorrect integer value: 'x' for column `test`.`jobs_dead`.`attempt` at row 1", dialects.Culprit{Column: "attempt"}},
		{1644, "dead letters are closed", dialects.Culprit{}},
	} {
		err := fmt.Errorf("settle: %w", &mysql.MySQLError{Number: c.number, Message: c.message})
		if got := (&Dialect{}).Culprit(err); got != c.want {
			t.Errorf("%d %q: %+v, want %+v", c.number, c.message, got, c.want)
		}
	}
}

// TestDeadLetterLikeGenerated: a dead-letter table made with CREATE TABLE … LIKE keeps
// the queue table's generated column generated: the move leaves it to the dead-letter
// table, which computes it again, and copies the queue table's own columns.
func TestDeadLetterLikeGenerated(t *testing.T) {
	d := newDialect(t)
	tbl := dialects.Table{Name: tableName(t, d, "dllike"), ID: "id", Payload: "payload", Attempt: "attempt", LockedUntil: "locked_until"}
	mustExec(t, d.DB(), "CREATE TABLE "+quote(tbl.Name)+` (
		id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		payload LONGBLOB NOT NULL,
		attempt INT NOT NULL DEFAULT 1,
		locked_until DATETIME(6),
		CUSTOMER VARCHAR(100) NOT NULL,
		details JSON,
		customer_key VARCHAR(100) AS (LOWER(CUSTOMER)) STORED)`)
	dead := tableName(t, d, "dllike_dead")
	mustExec(t, d.DB(), "CREATE TABLE "+quote(dead)+" LIKE "+quote(tbl.Name))
	mustExec(t, d.DB(), "INSERT INTO "+quote(tbl.Name)+` (payload, customer, details) VALUES ('x', 'ACME', '{"a": 1}')`)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: tbl, DeadLetterTable: dead})
	id := dialecttest.DeadLetterOne(t, q)
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(dead)+` WHERE id = ? AND customer = 'ACME' AND customer_key = 'acme'
		AND JSON_EXTRACT(details, '$.a') = 1 AND locked_until IS NULL`, id); n != 1 {
		t.Fatalf("the dead-letter table holds %d copies of the whole row", n)
	}
}
