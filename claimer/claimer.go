package claimer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/leaserenewer"
)

// defaultTimeout bounds a claim when Config.Timeout is 0.
const defaultTimeout = 30 * time.Second

// Request asks the claimer for up to Limit rows; with Batch, in one row lock claim
// transaction (batch handlers).
type Request struct {
	Limit int
	// Conns is how many of the pool's connections the subscription set aside for the
	// claim (its Budget share); the answer carries it back.
	Conns int
	// Wakes is the subscription's count of wakes when it sent the request; the answer
	// carries it back.
	Wakes uint64
	// Parked makes the request a ping to a claimer that failed: it claims nothing, and
	// its answer (Parked too) tells the subscription the claimer was restarted.
	Parked bool
	Batch  bool
	// Scan (advisory form) is how many candidates to read, at least Limit; Offset is where
	// in them to start trying keys, so that concurrent claims of one subscription do not
	// all reach for the same first row.
	Scan, Offset int
}

// IgnoreDeadLetterLogging: a request to a claimer that stopped is expected at shutdown.
func (*Request) IgnoreDeadLetterLogging() {}

// Claim is one claimed row and what holds it: the open claim transaction (row lock
// form) or the session holding its key (advisory form); the lease form holds nothing.
type Claim struct {
	Row     dialects.Row
	Locked  dialects.LockedClaim
	Session dialects.Session
	// Lease is the claim's lease in its subscription's book (lease form), set when the
	// subscription takes the row in.
	Lease *leaserenewer.Held
}

// Claimed answers a Request, sent with the claimer as its sender: the rows taken (fewer
// than asked when the queue ran short) and, when the claim failed part-way or at once,
// the error. After a failure the claimer fails too, and its supervisor restarts it after
// a backoff.
type Claimed struct {
	Limit int
	// Conns, Wakes and Parked are the request's.
	Conns  int
	Wakes  uint64
	Parked bool
	Claims []Claim
	// Batch is a batch request's claim transaction and its rows (Claims is empty).
	Batch dialects.LockedBatch
	Err   error
	// Took is how long the claim took; a chained claim's (Chained) includes the
	// settlement it went with.
	Took time.Duration
	// SetAside are the rows the claim took and set aside instead of delivering them
	// (poison.go); Claims and Batch hold the others.
	SetAside []SetAside
	// Chained says a settling delivery answered, not a claimer (Chained).
	Chained bool
}

// IgnoreDeadLetterLogging: the parent may have stopped meanwhile.
func (*Claimed) IgnoreDeadLetterLogging() {}

// Config is what a claimer needs.
type Config struct {
	// Queue serves Form: Subscribe checked it implements that form's interface.
	Queue dialects.Queue
	Form  dialects.Form
	// Lease is the lease length (lease form).
	Lease time.Duration
	Now   func() time.Time
	// Ctx bounds every claim; it ends when the subscription is torn down.
	Ctx context.Context
	// Dispatcher runs the claimer's mailbox; nil means Proto.Actor's default.
	Dispatcher actor.Dispatcher
	// Transactional sets the row lock claim's savepoint, and opens the advisory session's
	// transaction, right after the claim.
	Transactional bool
	// Timeout bounds each claim, waits for pool connections included; 0 means
	// defaultTimeout. A claim that runs out returns what it took so far.
	Timeout time.Duration
	// Handoff, when set, takes each answer before it is sent: false means the subscription
	// no longer takes claims (it is stopping) and has released the answer's rows itself,
	// so the answer is not sent. A stopping actor drops the messages still in its mailbox,
	// so rows sent to it would be lost with their locks, sessions and leases.
	Handoff func(*Claimed) bool
	// Poison is the subscription's record of the rows it sets aside, shared by its
	// claimers; nil sets rows aside without a dead letter or a retry_after column.
	Poison *Poison
	// Kept (advisory form), when set, keeps the candidates a claim read and did not try
	// for the next claims of the subscription's claimers, for a short while (kept.go).
	Kept *Kept
}

// Props returns the props of a claimer actor.
func Props(cfg Config) *actor.Props {
	if cfg.Poison == nil {
		cfg.Poison = &Poison{}
	}
	return actor.PropsFromProducer(func() actor.Actor { return &claimer{cfg: cfg} }, dispatch(cfg.Dispatcher)...)
}

type claimer struct {
	cfg Config
	// ctx bounds the claim in progress: the subscription's claim context and the deadline.
	ctx context.Context
	// aside collects the rows the claim in progress set aside.
	aside []SetAside
}

func (c *claimer) Receive(ctx actor.Context) {
	req, ok := ctx.Message().(*Request)
	if !ok {
		return
	}
	if req.Parked {
		// A ping to a claimer that failed: answering it says the restart happened.
		m := &Claimed{Parked: true, Wakes: req.Wakes}
		if c.cfg.Handoff == nil || c.cfg.Handoff(m) {
			ctx.Request(ctx.Parent(), m)
		}
		return
	}
	start := time.Now()
	c.aside = nil
	var cancel context.CancelFunc
	c.ctx, cancel = context.WithTimeout(c.cfg.Ctx, cmp.Or(c.cfg.Timeout, defaultTimeout))
	defer cancel()
	var (
		claims []Claim
		batch  dialects.LockedBatch
		err    error
	)
	if req.Batch {
		batch, err = c.claimBatch(req.Limit)
	} else {
		claims, err = c.claim(req)
	}
	if err != nil && c.cfg.Ctx.Err() != nil {
		err = nil // torn down: not a failure
	}
	m := &Claimed{Limit: req.Limit, Conns: req.Conns, Wakes: req.Wakes, Parked: req.Parked, Claims: claims, Batch: batch, Err: err, Took: time.Since(start), SetAside: c.aside}
	if c.cfg.Handoff != nil && !c.cfg.Handoff(m) {
		return // the subscription stopped: the handoff released the rows
	}
	ctx.Request(ctx.Parent(), m)
	if err != nil {
		panic(err) // the supervisor restarts this claimer after its backoff
	}
}

func (c *claimer) claim(req *Request) ([]Claim, error) {
	limit := req.Limit
	now := c.cfg.Now()
	switch c.cfg.Form {
	case dialects.FormRowLock:
		lc, ok, err := c.cfg.Queue.(dialects.RowLockQueue).ClaimLocked(c.ctx, now)
		if err != nil || !ok {
			return nil, wrapClaim(err)
		}
		if c.asideLocked(lc) {
			return nil, nil
		}
		if c.cfg.Transactional {
			txc, isTx := lc.(dialects.TxLockedClaim)
			if !isTx {
				_ = lc.Rollback(c.ctx)
				return nil, errors.New("claim row lock: the dialect's claim cannot lend its transaction")
			}
			if err := txc.Savepoint(c.ctx); err != nil {
				_ = lc.Rollback(c.ctx)
				return nil, fmt.Errorf("claim row lock: savepoint: %w", err)
			}
		}
		return []Claim{{Row: lc.Row(), Locked: lc}}, nil
	case dialects.FormLease:
		return c.claimLeases(c.cfg.Queue.(dialects.LeaseQueue), now, limit)
	case dialects.FormAdvisory:
		return c.claimAdvisory(c.cfg.Queue.(dialects.AdvisoryQueue), now, limit, max(req.Scan, limit), req.Offset)
	}
	return nil, fmt.Errorf("claimer: no claim for the %s form", c.cfg.Form)
}

// claimBatch claims up to limit rows in one row lock claim transaction.
func (c *claimer) claimBatch(limit int) (dialects.LockedBatch, error) {
	bq, ok := c.cfg.Queue.(dialects.RowLockBatchQueue)
	if !ok {
		return nil, errors.New("claim batch: the dialect's queue cannot claim rows in batches")
	}
	b, found, err := bq.ClaimLockedBatch(c.ctx, c.cfg.Now(), limit)
	if err != nil || !found {
		return nil, wrapClaim(err)
	}
	return c.asideBatch(b)
}

func dispatch(d actor.Dispatcher) []actor.PropsOption {
	if d == nil {
		return nil
	}
	return []actor.PropsOption{actor.WithDispatcher(d)}
}

// beginOn opens the transaction of a transactional advisory delivery on the session that
// holds its key.
func beginOn(ctx context.Context, s dialects.Session) error {
	ts, ok := s.(dialects.TxSession)
	if !ok {
		return errors.New("the dialect's session cannot lend a transaction")
	}
	return ts.Begin(ctx)
}

func wrapClaim(err error) error {
	if err != nil {
		return fmt.Errorf("claim row lock: %w", err)
	}
	return nil
}

// claimLeases stamps up to limit rows with a lease in one commit.
func (c *claimer) claimLeases(q dialects.LeaseQueue, now time.Time, limit int) ([]Claim, error) {
	rows, err := q.ClaimLeases(c.ctx, now, leaserenewer.Expiry(now, c.cfg.Lease), limit)
	if err != nil {
		return nil, fmt.Errorf("claim leases: %w", err)
	}
	claims := make([]Claim, 0, len(rows))
	for _, r := range rows {
		if !c.asideLease(q, r) {
			claims = append(claims, Claim{Row: r})
		}
	}
	return claims, nil
}

// claimAdvisory takes up to limit rows: for each candidate it locks the key without
// waiting, on a session of its own, and takes the row only if it is still claimable. A
// key held elsewhere, or a row settled meanwhile, is passed over and its session ended.
// Candidates kept from an earlier read come first (Config.Kept): with fast handlers a
// claim of one row then seldom pays a read of its own. Where the queue takes rows
// together (dialects.TakesTogether), the claim locks its keys first and takes their rows
// in one statement; rows gone meanwhile are replaced from the candidates left.
func (c *claimer) claimAdvisory(q dialects.AdvisoryQueue, now time.Time, limit, scan, offset int) ([]Claim, error) {
	a := &advisoryClaim{c: c, q: q, now: now, limit: limit,
		claims:  make([]Claim, 0, limit),
		taken:   make(map[string]struct{}, limit),
		pending: make(map[string]struct{}),
		passed:  make(map[string]struct{}),
	}
	if !c.cfg.Transactional {
		// A transactional row's transaction opens right after its take, and on SQLite an
		// IMMEDIATE or EXCLUSIVE one holds the write lock until its handler ends: the
		// next row's take or BEGIN waits for it up to busy_timeout. Taken together, every
		// row would have its attempt counted before that wait, and those whose BEGIN
		// fails would be given back with an attempt spent unhandled. One by one, the
		// take that waits fails and counts nothing.
		a.together, _ = q.(dialects.TakesTogether)
	}
	err := a.claim(scan, offset)
	if err != nil {
		a.unlockPending() // keys locked for rows the claim will not take now
	}
	return a.claims, err
}

func (a *advisoryClaim) claim(scan, offset int) error {
	c := a.c
	for {
		for a.short() {
			cand, ok := c.cfg.Kept.take(c.cfg.Poison)
			if !ok {
				break
			}
			if err := a.try(cand); err != nil {
				return err
			}
			if _, held := a.passed[cand.Key]; held {
				c.cfg.Kept.drop(cand.Key)
			}
		}
		if len(a.locked) == 0 {
			break
		}
		if err := a.takeLocked(); err != nil {
			return err
		}
	}
	if len(a.claims) == a.limit {
		return nil
	}
	// Rows set aside in memory are passed over: read as many more candidates.
	cands, err := a.q.Candidates(c.ctx, a.now, c.cfg.Kept.read(scan)+min(c.cfg.Poison.skips(), maxSkipScan))
	if err != nil {
		return fmt.Errorf("advisory candidates: %w", err)
	}
	read := time.Now()
	cands = slices.DeleteFunc(cands, func(cand dialects.Candidate) bool { return c.cfg.Poison.isSkipped(cand.ID) })
	if n := len(cands); n > 1 && offset%n != 0 {
		cands = append(cands[offset%n:], cands[:offset%n]...)
	}
	i := 0
	for i < len(cands) && a.short() {
		for ; i < len(cands) && a.short(); i++ {
			if err := a.try(cands[i]); err != nil {
				return err
			}
		}
		if err := a.takeLocked(); err != nil {
			return err
		}
	}
	c.cfg.Kept.keep(cands[i:], a.taken, a.passed, read)
	return nil
}

// advisoryClaim is one advisory claim under way.
type advisoryClaim struct {
	c        *claimer
	q        dialects.AdvisoryQueue
	together dialects.TakesTogether // nil: each row is taken as its key is locked
	now      time.Time
	limit    int
	claims   []Claim
	// locked holds the sessions whose keys are locked and whose rows are still to be
	// taken together (takeLocked), lockedKeys their keys, and pending the same keys as
	// a set.
	locked     []dialects.Take
	lockedKeys []string
	pending    map[string]struct{}
	// taken holds the keys of the claim's rows (and of those locked): a claim takes one
	// row per key. passed holds the keys found held elsewhere: their later rows are
	// passed over too, so that a key's rows are tried in the order read.
	taken, passed map[string]struct{}
}

// short reports whether the claim still wants rows.
func (a *advisoryClaim) short() bool { return len(a.claims)+len(a.locked) < a.limit }

// try locks cand's key on a session of its own and takes its row (or, taking together,
// keeps the session for takeLocked), unless the claim has a row of that key already or
// found it held elsewhere.
func (a *advisoryClaim) try(cand dialects.Candidate) error {
	ctx := a.c.ctx
	if _, dup := a.taken[cand.Key]; dup {
		if _, pending := a.pending[cand.Key]; !pending {
			return nil
		}
		// The key's earlier row is locked, not yet taken: take it first. If it was gone,
		// this row is the key's next in the order read, as a take one by one finds.
		if err := a.takeLocked(); err != nil {
			return err
		}
		if _, dup := a.taken[cand.Key]; dup {
			return nil
		}
	}
	if _, held := a.passed[cand.Key]; held {
		return nil
	}
	s, err := a.q.Session(ctx)
	if err != nil {
		return fmt.Errorf("advisory session: %w", err)
	}
	locked, err := s.TryLock(ctx, cand.Key)
	if err != nil || !locked {
		_, uerr := s.Unlock(ctx)
		if err != nil || uerr != nil {
			return fmt.Errorf("advisory lock of key %q: %w", cand.Key, errors.Join(err, uerr))
		}
		a.passed[cand.Key] = struct{}{}
		return nil
	}
	a.taken[cand.Key] = struct{}{}
	if a.together != nil {
		a.locked = append(a.locked, dialects.Take{Session: s, ID: cand.ID})
		a.lockedKeys = append(a.lockedKeys, cand.Key)
		a.pending[cand.Key] = struct{}{}
		return nil
	}
	row, ok, err := s.Take(ctx, cand.ID, a.now)
	return a.took(dialects.Take{Session: s, ID: cand.ID, Row: row, OK: ok}, cand.Key, err)
}

// takeLocked takes the rows of the locked sessions in one statement.
func (a *advisoryClaim) takeLocked() error {
	if len(a.locked) == 0 {
		return nil
	}
	takes, keys := a.locked, a.lockedKeys
	a.locked, a.lockedKeys = nil, nil
	clear(a.pending)
	err := a.together.TakeAll(a.c.ctx, a.now, takes)
	var errs []error
	for i, t := range takes {
		if terr := a.took(t, keys[i], err); terr != nil {
			errs = append(errs, terr)
		}
	}
	return errors.Join(errs...)
}

// unlockPending ends the sessions locked for rows not taken yet, as a claim that failed
// returns: their keys must not stay locked with nobody to take or unlock them.
func (a *advisoryClaim) unlockPending() {
	for _, t := range a.locked {
		_, _ = t.Session.Unlock(a.c.ctx)
	}
	a.locked, a.lockedKeys = nil, nil
	clear(a.pending)
}

// took ends the take of key's row: a row taken joins the claim, unless it is set aside; a
// row not taken, or a take that failed (err), unlocks its key.
func (a *advisoryClaim) took(t dialects.Take, key string, err error) error {
	ctx, s := a.c.ctx, t.Session
	if err != nil || !t.OK {
		_, uerr := s.Unlock(ctx)
		if err != nil || uerr != nil {
			return fmt.Errorf("advisory take of row %d: %w", t.ID, errors.Join(err, uerr))
		}
		// The key's later rows may still be tried.
		delete(a.taken, key)
		return nil
	}
	row := t.Row
	row.Key = key
	if a.c.asideTaken(s, row) {
		delete(a.taken, key) // unlocked: the key's later rows may still be tried
		return nil
	}
	if a.c.cfg.Transactional {
		// The delivery's transaction outlives the claim: on SQLite, database/sql rolls a
		// transaction back when its opening context ends.
		if err := beginOn(a.c.cfg.Ctx, s); err != nil {
			_ = s.Abort(ctx)
			return fmt.Errorf("advisory take of row %d: %w", t.ID, err)
		}
	}
	a.claims = append(a.claims, Claim{Row: row, Session: s})
	return nil
}
