package claimer

import (
	"cmp"
	"context"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// Chained answers req, a row lock subscription's claim for a worker, on behalf of the
// delivery it was sent to instead of a claimer: the delivery that freed the worker, whose
// settlement claimed the next row on its connection (dialects.ChainingClaim). ran says
// that claim ran, with next its row (nil: none was due) or err its failure; when it did
// not (the settlement failed, or took another way), the claim is made here, on a
// connection of its own, as a claimer makes it. A claimed row is vetted as a claimer's
// is (poison.go). The answer is marked Chained: its sender is no claimer.
func Chained(cfg Config, req *Request, start time.Time, ran bool, next dialects.LockedClaim, err error) *Claimed {
	if cfg.Poison == nil {
		cfg.Poison = &Poison{}
	}
	c := &claimer{cfg: cfg}
	var cancel context.CancelFunc
	c.ctx, cancel = context.WithTimeout(cfg.Ctx, cmp.Or(cfg.Timeout, defaultTimeout))
	defer cancel()
	var claims []Claim
	switch {
	case !ran:
		claims, err = c.claim(req)
	case err != nil:
		err = wrapClaim(err)
	case next != nil && !c.asideLocked(next):
		claims = []Claim{{Row: next.Row(), Locked: next}}
	}
	if err != nil && cfg.Ctx.Err() != nil {
		err = nil // torn down: not a failure
	}
	return &Claimed{Limit: req.Limit, Conns: req.Conns, Wakes: req.Wakes, Claims: claims, Err: err,
		Took: time.Since(start), SetAside: c.aside, Chained: true}
}
