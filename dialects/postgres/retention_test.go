package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// A leader whose session ends (its process died, its connection was killed) hands the
// leadership over: the server releases its key, and another dialect leads.
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
	var killed int
	if err := b.Pool().QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory'"+
		" AND granted AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 0)", dialects.LeaderKey(name)).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminate the leader's session: %d %v", killed, err)
	}
	if err := la.Alive(ctx); err == nil {
		t.Error("the killed leadership reports itself alive")
	}
	dialecttest.WaitLeads(t, b, name)
	_ = la.Resign(ctx) // its connection is gone: an error, and nothing left behind
}
