package mysql

import (
	"strings"
	"testing"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func TestSchema(t *testing.T) {
	d := newDialect(t)
	name := tableName(t, d, "ra_schema")
	tbl := dialects.Table{Name: name, ID: "id", Payload: "payload", Group: "grp", Attempt: "attempt",
		RetryAfter: "retry_after", ProcessedAt: "processed_at", Headers: "headers", AdvisoryKey: "acc-{account}-{id}"}
	ddl, err := d.Schema(tbl)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"CREATE TABLE IF NOT EXISTS `" + name + "`",
		"`id` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
		"`payload` LONGBLOB NOT NULL",
		"`grp` VARCHAR(191) NOT NULL DEFAULT ''",
		"`attempt` INT NOT NULL DEFAULT 1",
		"`retry_after` DATETIME(6) NULL",
		"`processed_at` DATETIME(6) NULL",
		"`headers` JSON NULL",
		"`account` VARCHAR(191) NULL",
		"INDEX `" + name + "_claim` (`grp`, `processed_at`, `id`)",
		"ENGINE=InnoDB",
	} {
		dialecttest.Contains(t, ddl, want)
	}
	if strings.Count(ddl, "`id`") != 2 {
		t.Errorf("the id column is declared twice:\n%s", ddl)
	}
	// It runs, twice, and the queue opens on it.
	for range 2 {
		createTable(t, d, tbl)
	}
	dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl, Group: "g"})

	// The claim of a group reads the index in claim order, with no sort.
	var plan string
	rows, err := d.DB().QueryContext(ctx, "EXPLAIN SELECT id FROM "+quote(name)+" WHERE grp = 'g' AND processed_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED")
	if err != nil {
		t.Fatal(err)
	}
	cols, _ := rows.Columns()
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for i, c := range cols {
			if c == "key" || c == "Extra" {
				if b, ok := vals[i].([]byte); ok {
					plan += c + "=" + string(b) + " "
				}
			}
		}
	}
	rows.Close()
	if !strings.Contains(plan, "key="+name+"_claim") || strings.Contains(plan, "filesort") {
		t.Errorf("claim plan: %s", plan)
	}
}

func TestSchemaVariants(t *testing.T) {
	d := New(nil)
	// No group, no processed_at: no index beyond the primary key.
	ddl, err := d.Schema(dialects.Table{Name: "m", ID: "k", Payload: "body", LockedUntil: "lease"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ddl, "INDEX") || !strings.Contains(ddl, "`lease` DATETIME(6) NULL") {
		t.Errorf("ddl:\n%s", ddl)
	}
	// A processed_at without groups is indexed for the claim too.
	ddl, _ = d.Schema(dialects.Table{Name: "m", ID: "k", Payload: "body", ProcessedAt: "done"})
	dialecttest.Contains(t, ddl, "INDEX `m_claim` (`done`, `k`)")
	// An index name past 64 characters falls back to a fixed one.
	long := strings.Repeat("t", 60)
	ddl, _ = d.Schema(dialects.Table{Name: long, ID: "id", Payload: "p", Group: "g"})
	dialecttest.Contains(t, ddl, "INDEX `rowactor_claim` (`g`, `id`)")
	if _, err := d.Schema(dialects.Table{Name: "x", ID: "id", Payload: "p", Mode: dialects.Immediate}); err == nil {
		t.Error("Schema accepted an SQLite mode")
	}
	if _, err := d.Schema(dialects.Table{Name: "x"}); err == nil {
		t.Error("Schema accepted a table without columns")
	}
}
