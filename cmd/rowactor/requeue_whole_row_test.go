package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
)

// TestRequeueWholeRow runs on every database: requeue -from-table moves every column the
// dead-letter table shares with the queue table, the service's own included (the queue
// table's customer is NOT NULL without a default), and refuses a dead-letter table
// without that column, naming it, before anything moves.
func TestRequeueWholeRow(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			f := newFixture(t, db)
			q := db.quote
			text := map[string]string{"sqlite": "TEXT", "postgres": "text", "mysql": "VARCHAR(100)"}[db.name]
			tb := rowactor.Table{Name: f.tableName("ra_cli_wr_"), ID: "id", Payload: "payload", Attempt: "attempt",
				RetryAfter: "retry_after"}
			// createWith creates a table from Schema with extra column definitions.
			createWith := func(tb rowactor.Table, extra string) {
				t.Helper()
				ddl, err := rowactor.Schema(f.b.Dialect(), tb)
				if err != nil {
					t.Fatal(err)
				}
				end := strings.Index(ddl, "\n)")
				if extra != "" {
					ddl = ddl[:end] + ",\n  " + extra + ddl[end:]
				}
				for _, s := range strings.Split(ddl, ";\n") {
					if strings.TrimSpace(s) != "" {
						f.exec(s)
					}
				}
			}
			createWith(tb, q("customer")+" "+text+" NOT NULL, "+q("note")+" "+text)
			dead, lean := tb, tb
			dead.Name, lean.Name = f.tableName("ra_cli_wr_dead_"), f.tableName("ra_cli_wr_lean_")
			note := "Note" // names fold: the queue table's note
			if db.name == "postgres" {
				note = "note" // quoted names keep their case
			}
			createWith(dead, q(note)+" "+text+", "+q("customer")+" "+text)
			createWith(lean, "")
			retryAt := db.timeArg(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
			f.exec("INSERT INTO "+q(dead.Name)+" (id, payload, attempt, retry_after, customer, "+q(note)+") VALUES (7, ?, 5, ?, 'ACME', 'late')",
				[]byte("job-7"), retryAt)
			f.exec("INSERT INTO "+q(lean.Name)+" (id, payload, attempt, retry_after) VALUES (7, ?, 5, ?)", []byte("job-7"), retryAt)
			requeue := func(from string) (int, string, string) {
				return cli(append(append([]string{"requeue", "-dsn", f.dsn, "-from-table", from}, columnFlags(tb)...), tb.Name)...)
			}

			code, out, errOut := requeue(lean.Name)
			if code != exitFailed || out != "" || !strings.Contains(errOut, `column "customer" is NOT NULL without a default`) ||
				!strings.Contains(errOut, lean.Name) {
				t.Fatalf("requeue from a dead-letter table without customer: exit %d, stdout %q, stderr %q; want 1 and a refusal naming the column", code, out, errOut)
			}
			if rows := f.rows(tb, lean.Name); len(rows) != 1 {
				t.Fatalf("the refused requeue changed the dead-letter table: %v", rows)
			}

			code, out, errOut = requeue(dead.Name)
			if code != exitOK || out != fmt.Sprintf("moved 1 row from table %s into table %s\n", dead.Name, tb.Name) {
				t.Fatalf("requeue: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			var customer, gotNote string
			var attempt int
			var retry any
			err := f.sql.QueryRowContext(ctx, db.rebind("SELECT customer, "+q("note")+", attempt, retry_after FROM "+q(tb.Name)+" WHERE id = ?"), 7).
				Scan(&customer, &gotNote, &attempt, &retry)
			if err != nil || customer != "ACME" || gotNote != "late" || attempt != 1 || retry != nil {
				t.Fatalf("the requeued row: customer %q, note %q, attempt %d, retry_after %v, %v", customer, gotNote, attempt, retry, err)
			}
		})
	}
}
