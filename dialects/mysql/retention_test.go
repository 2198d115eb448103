package mysql

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A leader whose session ends (its process died, its connection was killed) hands the
// leadership over: the server releases its lock, and another dialect leads.
func TestLeadershipEndsWithItsSession(t *testing.T) {
	ctx := context.Background()
	a, b := newDialect(t), newDialect(t)
	name := "ra_lead_kill_" + time.Now().Format("150405.000000000")
	la, ok, err := a.Lead(ctx, name)
	if err != nil || !ok {
		t.Fatalf("Lead: %v %v", ok, err)
	}
	if _, ok, _ := b.Lead(ctx, name); ok {
		t.Fatal("two leaders")
	}
	var holder int64
	if err := b.DB().QueryRowContext(ctx, "SELECT IS_USED_LOCK("+lockNameExpr(utf8mb4("?"))+")", leaderKey(name)...).Scan(&holder); err != nil || holder == 0 {
		t.Fatalf("the leader's session: %d %v", holder, err)
	}
	if _, err := b.DB().ExecContext(ctx, "KILL ?", holder); err != nil {
		t.Fatalf("kill the leader's session: %v", err)
	}
	if err := la.Alive(ctx); err == nil {
		t.Error("the killed leadership reports itself alive")
	}
	dialecttest.WaitLeads(t, b, name)
	_ = la.Resign(ctx)
}
