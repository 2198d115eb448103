package sqlite

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/sqlpart"
	"github.com/rowactor/rowactor/dialects/sqlstmt"
)

// maxExtend bounds the leases one extension statement names, far below SQLite's limit
// of 32766 parameters.
const (
	extendSlots = 13
	maxExtend   = 1 << (extendSlots - 1)
)

type leaseQueue struct {
	queue
	claim string
	// priority: the claim returns each row's priority last, which orders the rows.
	priority bool
	// confirm confirms a row holds a token before an event runs (events.go).
	confirm string
	// holds reads whether a row holds a token (Holding).
	holds string

	// extendPrefix and extendSuffix wrap the VALUES list of the extension.
	extendPrefix string
	extendSuffix string
	extendMu     sync.Mutex
	// extend caches the extension text per power-of-two lease count: a short list is
	// padded with its last lease (a repeated pair changes nothing), so a handful of
	// texts serve every count.
	extend [extendSlots]string
	// batch are the batched acks and releases (batch.go).
	batch *batchSQL
}

var _ dialects.LeaseQueue = (*leaseQueue)(nil)

func newLeaseQueue(base queue, t dialects.Table) *leaseQueue {
	tq, id, lu := quote(t.Name), quote(t.ID), quote(t.LockedUntil)
	var b strings.Builder
	b.WriteString("UPDATE " + tq + " SET " + lu + " = :until")
	if t.Attempt != "" {
		b.WriteString(", " + quote(t.Attempt) + " = " + sqlpart.CountAttempt(quote(t.Attempt), attemptMax))
	}
	// One autocommit statement: it takes the write lock when it starts, where the busy
	// handler can wait, and the lease and the count commit together.
	b.WriteString(" WHERE " + id + " IN (SELECT " + id + " FROM " + tq + " WHERE " + claimable(t, true) +
		" ORDER BY " + t.ClaimOrder(quote, "") + " LIMIT " + limitParam + ") RETURNING " + id + ", " + quote(t.Payload))
	if t.Attempt != "" {
		// RETURNING sees the counted value; the delivery reports the one before.
		b.WriteString(", " + quote(t.Attempt) + " - 1")
	}
	if t.Headers != "" {
		b.WriteString(", " + quote(t.Headers))
	}
	if t.Priority != "" {
		b.WriteString(", " + quote(t.Priority)) // to hand the rows out in claim order
	}
	return &leaseQueue{
		queue:        base,
		priority:     t.Priority != "",
		claim:        b.String(),
		confirm:      confirmText(t),
		holds:        "SELECT " + id + " FROM " + tq + " WHERE " + id + " = ? AND " + lu + " = ?",
		extendPrefix: "UPDATE " + tq + " SET " + lu + " = ? WHERE (" + id + ", " + lu + ") IN (VALUES ",
		extendSuffix: ") RETURNING " + id,
		batch:        newBatchSQL(t),
	}
}

func (q *leaseQueue) prepare(ctx context.Context) error {
	texts := append(q.settle.texts(), q.claim, q.extendText(0, 1), q.confirm)
	if err := q.d.prepareAll(ctx, append(texts, q.batch.texts()...)...); err != nil {
		return q.errorf("prepare", err)
	}
	return nil
}

func (q *leaseQueue) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	if limit <= 0 {
		return nil, nil
	}
	if err := checkExpiry(now, until); err != nil {
		return nil, q.errorf("claim", err)
	}
	if err := q.f.lockWriter(ctx); err != nil {
		return nil, q.errorf("claim", err)
	}
	defer q.f.unlockWriter()
	rows, err := q.query(ctx, q.claim,
		sql.Named("until", formatTime(until)),
		sql.Named("now", formatTime(now)),
		sql.Named("group", q.group),
		sql.Named("limit", int64(limit)))
	if err != nil {
		return nil, q.errorf("claim", err)
	}
	defer rows.Close()
	var out []dialects.Row
	// Each row's priority, by id, when the table has priorities. Read as whatever the
	// column holds: a NULL (a hand-written table's nullable column) or any other value
	// SQLite keeps is a row like the others, never an unreadable one.
	var prio map[int64]any
	var (
		p  any
		sc *rowScanner
	)
	if q.priority {
		sc = q.rowScanner(false, &p)
	} else {
		sc = q.rowScanner(false)
	}
	for rows.Next() {
		r, err := sc.scan(rows)
		if err != nil {
			return nil, q.errorf("claim", err)
		}
		r.Token = until
		out = append(out, r)
		if q.priority {
			if prio == nil {
				prio = map[int64]any{}
			}
			prio[r.ID] = p
		}
	}
	if err := rows.Err(); err != nil {
		return nil, q.errorf("claim", err)
	}
	// RETURNING yields rows in no particular order; deliveries go out in claim order.
	slices.SortFunc(out, func(a, b dialects.Row) int {
		if c := cmpValues(prio[a.ID], prio[b.ID]); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out, nil
}

// checkExpiry refuses a claim whose lease would not end after now, as stored (TimeLayout
// keeps microseconds). A claim takes only rows whose lease ended at or before now, so an
// expiry after now makes each claim of a row write a token later than the one it
// replaces: no two deliveries of a row ever hold the same token.
func checkExpiry(now, until time.Time) error {
	if u, n := formatTime(until), formatTime(now); u <= n {
		return fmt.Errorf("the lease expiry %s is not after now %s", u, n)
	}
	return nil
}

// scanRow reads id, payload[, attempt - 1][, headers][, key][, extra...]. A row whose
// values do not scan (SQLite keeps whatever type it is given) is returned flagged
// (Row.Fault).
func (q *queue) scanRow(rows *sql.Rows, withKey bool, extra ...any) (dialects.Row, error) {
	return q.rowScanner(withKey, extra...).scan(rows)
}

// rowScanner returns a scanner of a claim's rows, its destinations made once for all of
// them: a row scanned on its own put each destination on the heap, four allocations a
// row. extra are the caller's own destinations, after the row's columns; the caller
// reads them after each scan.
func (q *queue) rowScanner(withKey bool, extra ...any) *rowScanner {
	s := &rowScanner{q: q}
	s.dest = append(s.dest, &s.r.ID, &s.r.Payload)
	if q.hasAttempt {
		s.dest = append(s.dest, &s.attempt)
	}
	if q.hasHeaders {
		s.dest = append(s.dest, &s.r.Headers)
	}
	if withKey {
		s.dest = append(s.dest, &s.key)
	}
	s.dest = append(s.dest, extra...)
	return s
}

type rowScanner struct {
	q       *queue
	r       dialects.Row
	attempt sql.NullInt64
	key     sql.NullString
	dest    []any
}

// scan reads the row rows stands on. The payload and headers are the row's own: Scan
// copies a []byte column into a new slice.
func (s *rowScanner) scan(rows *sql.Rows) (dialects.Row, error) {
	s.r, s.attempt, s.key = dialects.Row{}, sql.NullInt64{}, sql.NullString{}
	if err := rows.Scan(s.dest...); err != nil {
		return sqlstmt.Unreadable(rows, s.q.name, err)
	}
	r := s.r
	if r.Payload == nil {
		r.Payload = []byte{}
	}
	r.Attempt = int(s.attempt.Int64)
	r.Key = s.key.String
	return r, nil
}

// cmpValues compares two column values as SQLite's ORDER BY does: NULL first, then
// numbers (by value), then text, then blobs.
func cmpValues(a, b any) int {
	rank := func(v any) int {
		switch v.(type) {
		case nil:
			return 0
		case int64, float64:
			return 1
		case string:
			return 2
		}
		return 3
	}
	if ra, rb := rank(a), rank(b); ra != rb {
		return cmp.Compare(ra, rb)
	}
	switch x := a.(type) {
	case int64:
		if y, ok := b.(int64); ok {
			return cmp.Compare(x, y)
		}
		return cmp.Compare(float64(x), b.(float64))
	case float64:
		if y, ok := b.(int64); ok {
			return cmp.Compare(x, float64(y))
		}
		return cmp.Compare(x, b.(float64))
	case string:
		return strings.Compare(x, b.(string))
	case []byte:
		y, _ := b.([]byte)
		return bytes.Compare(x, y)
	}
	return 0
}

func (q *leaseQueue) ExtendLeases(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	if len(held) == 0 {
		return nil, nil
	}
	if ev, own := q.events[dialects.EventExtend]; own {
		return q.extendEach(ctx, ev, until, held)
	}
	var moved []int64
	for start := 0; start < len(held); start += maxExtend {
		chunk := held[start:min(start+maxExtend, len(held))]
		ids, err := q.extendChunk(ctx, until, chunk)
		if err != nil {
			return moved, err
		}
		moved = append(moved, ids...)
	}
	return moved, nil
}

func (q *leaseQueue) extendChunk(ctx context.Context, until time.Time, held []dialects.Lease) ([]int64, error) {
	slot := bits.Len(uint(len(held) - 1)) // the smallest power of two >= len(held)
	n := 1 << slot
	text := q.extendText(slot, n)
	args := make([]any, 0, 1+2*n)
	args = append(args, formatTime(until))
	for i := range n {
		l := held[min(i, len(held)-1)]
		args = append(args, l.ID, formatTime(l.Token))
	}
	if err := q.f.lockWriter(ctx); err != nil {
		return nil, q.errorf("extend", err)
	}
	defer q.f.unlockWriter()
	rows, err := q.query(ctx, text, args...)
	if err != nil {
		return nil, q.errorf("extend", err)
	}
	ids, err := scanIDs(rows)
	if err != nil {
		return nil, q.errorf("extend", err)
	}
	return ids, nil
}

func (q *leaseQueue) extendText(slot, n int) string {
	q.extendMu.Lock()
	defer q.extendMu.Unlock()
	if q.extend[slot] == "" {
		var b strings.Builder
		b.Grow(len(q.extendPrefix) + 6*n + len(q.extendSuffix))
		b.WriteString(q.extendPrefix)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?)")
		}
		b.WriteString(q.extendSuffix)
		q.extend[slot] = b.String()
	}
	return q.extend[slot]
}

// Holding reads which rows of held hold their tokens, a row at a time: the renewer reads
// back only a round it did not hear the end of.
func (q *leaseQueue) Holding(ctx context.Context, held []dialects.Lease) ([]int64, error) {
	var found []int64
	for _, l := range held {
		rows, err := q.query(ctx, q.holds, l.ID, formatTime(l.Token))
		if err != nil {
			return nil, q.errorf("read leases", err)
		}
		ids, err := scanIDs(rows)
		if err != nil {
			return nil, q.errorf("read leases", err)
		}
		found = append(found, ids...)
	}
	return found, nil
}

// SettleLeaseWaiting is SettleLease: SQLite's locks live in this process, and a statement
// whose context ends is interrupted before the call returns, so a wait cut short leaves
// nothing to run later.
func (q *leaseQueue) SettleLeaseWaiting(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	return q.SettleLease(ctx, step, held)
}

func (q *leaseQueue) SettleLease(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	st, err := q.leaseSettlement(step, held)
	if err != nil {
		return false, err
	}
	return q.run(ctx, st)
}

// leaseSettlement picks the step's statement, fenced by the token; a step naming an event
// runs the event once the token is confirmed.
func (q *leaseQueue) leaseSettlement(step dialects.Step, held dialects.Lease) (settlement, error) {
	if step.Event != "" {
		return q.leaseEvent(step, held)
	}
	return q.settlement(step, sql.Named("id", held.ID), sql.Named("token", formatTime(held.Token)))
}

// settlement picks a built-in step's statement; key names the row (:id, and :token in
// the lease form). Every statement gets :err, which only those writing the error column
// name.
func (q *queue) settlement(step dialects.Step, key ...any) (settlement, error) {
	s := &q.settle
	args := func(more ...any) []any {
		return append(append(append([]any{}, key...), sql.Named("err", step.ErrorValue())), more...)
	}
	switch step.Kind {
	case dialects.StepAck:
		text := s.ack
		if step.Unstarted {
			text = s.ackUnstarted
		}
		return settlement{op: "ack", text: text, args: args(sql.Named("now", formatTime(step.Now)))}, nil
	case dialects.StepRetry:
		if s.retryNeedsError && step.Error == "" {
			return settlement{op: "retry"}, nil // the unlock returns the row
		}
		return settlement{op: "retry", text: s.retry, args: args()}, nil
	case dialects.StepRelease:
		if step.Unstarted {
			return settlement{op: "release", text: s.giveBack, args: args()}, nil
		}
		return settlement{op: "release", text: s.release, args: args()}, nil
	case dialects.StepRetryAfter, dialects.StepSnooze:
		text := s.retryAfter
		if step.Kind == dialects.StepSnooze {
			text = s.snooze
		}
		if text == "" {
			return settlement{}, q.errorf(step.Kind.String(), errNoRetryAfter)
		}
		return settlement{op: step.Kind.String(), text: text, args: args(sql.Named("at", formatTime(step.At)))}, nil
	case dialects.StepDeadLetter:
		switch {
		case s.deadGroup != "":
			return settlement{op: "dead-letter", text: s.deadGroup, args: args(sql.Named("dest", s.destGroup), sql.Named("now", formatTime(step.Now)))}, nil
		case s.moveInsert != "":
			return settlement{op: "dead-letter move", move: true, args: args(sql.Named("now", formatTime(step.Now)))}, nil
		}
		return settlement{}, q.errorf("dead-letter", errNoDeadLetter)
	}
	return settlement{}, q.errorf("settle", fmt.Errorf("unknown step %v", step.Kind))
}

var (
	errNoRetryAfter = errors.New("the table has no retry_after column")
	errNoDeadLetter = errors.New("the subscription has no dead letter (DeadLetterGroup or DeadLetterTable)")
)
