package claimer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestAdvisoryClaimTakesAKeysNextRowAfterSettingOneAside: a row the claim sets aside
// (poison) has its key unlocked, so the same claim goes on to the key's next row, on
// every database, whether the queue takes rows together or one at a time.
func TestAdvisoryClaimTakesAKeysNextRowAfterSettingOneAside(t *testing.T) {
	for _, db := range keptDBs(t) {
		t.Run(db.name, func(t *testing.T) {
			q, _ := keptTable(t, db, "poisonnext", "a", "a", "b")
			ctx := context.Background()
			p := &Poison{}
			p.Suspect(1, errors.New("its last settlement failed on its data"))
			c := &claimer{cfg: Config{Poison: p, Ctx: ctx, Now: time.Now}, ctx: ctx}
			claims, err := c.claimAdvisory(q, time.Now(), 2, 3, 0)
			defer unlockAll(t, claims)
			if err != nil || fmt.Sprint(rowIDs(claims)) != "[2 3]" || len(c.aside) != 1 || c.aside[0].Row.ID != 1 {
				t.Fatalf("claim %v, %v, set aside %d; want row 1 set aside and rows 2 and 3 claimed", rowIDs(claims), err, len(c.aside))
			}
		})
	}
}
