package sqlite

import (
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

func TestSchemaText(t *testing.T) {
	dialecttest.SchemaText(t, New(nil), "jo`bs", "CREATE TABLE IF NOT EXISTS `jo``bs` (\n"+
		"  `id` INTEGER PRIMARY KEY AUTOINCREMENT,\n"+
		"  `payload` BLOB NOT NULL,\n"+
		"  `grp` TEXT NOT NULL DEFAULT '',\n"+
		"  `attempt` INTEGER NOT NULL DEFAULT 1,\n"+
		"  `retry_after` TEXT,\n"+
		"  `processed_at` TEXT,\n"+
		"  `locked_until` TEXT,\n"+
		"  `headers` TEXT\n"+
		");\n"+
		"CREATE INDEX IF NOT EXISTS `jo``bs_claim` ON `jo``bs` (`grp`, `id`) WHERE `processed_at` IS NULL;\n",
		"CREATE TABLE IF NOT EXISTS `m` (\n  `id` INTEGER PRIMARY KEY AUTOINCREMENT,\n  `body` BLOB NOT NULL,\n  `account` TEXT\n);\n")
}

// The rendered schema makes a table each form can be opened on and worked.
func TestSchemaWorks(t *testing.T) {
	d := newDialect(t)
	lease := leaseTable("select")
	lease.ProcessedAt = "processed_at"
	createTable(t, d, lease)
	q := dialecttest.OpenLease(t, d, dialects.QueueSpec{Table: lease})
	dialecttest.Publish(t, d, lease, dialects.Message{Payload: []byte("p")})
	rows, err := q.ClaimLeases(ctx, t0, t0.Add(time.Second), 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	if ok, err := q.SettleLease(ctx, dialects.Step{Kind: dialects.StepAck, Now: t0}, dialects.Lease{ID: rows[0].ID, Token: rows[0].Token}); !ok || err != nil {
		t.Fatalf("ack: %v %v", ok, err)
	}

	adv := dialects.Table{Name: "adv", ID: "id", Payload: "payload", Attempt: "attempt", AdvisoryKey: "adv-{account}"}
	createTable(t, d, adv)
	aq := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: adv})
	mustExec(t, d, "INSERT INTO adv (payload, account) VALUES ('p', 'a')")
	c, err := aq.Candidates(ctx, t0, 1)
	if err != nil || len(c) != 1 || c[0].Key != "adv-a" {
		t.Fatalf("candidates: %v %v", c, err)
	}
}
