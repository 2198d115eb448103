package rowactor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// Fail, RetryPolicy, Snooze and the error column, over every (database, form,
// transactional). Each scenario checks the table's rows, the hook's settlements and, where
// the outcome logs, the log records' attributes.

// logRecords is a slog handler that keeps every record, for checks on their attributes.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// logged returns the attributes of each record at level whose message contains msg.
func (l *logRecords) logged(level slog.Level, msg string) []map[string]slog.Value {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range l.recs {
		if r.Level != level || !strings.Contains(r.Message, msg) {
			continue
		}
		attrs := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
		out = append(out, attrs)
	}
	return out
}

// captured starts a broker whose logs go to the returned records.
func (h *harness) captured(opts ...rowactor.Option) (*rowactor.Broker, *logRecords) {
	h.t.Helper()
	logs := &logRecords{}
	return h.broker(append(opts, rowactor.WithLogger(slog.New(logs)))...), logs
}

// note writes a note through a transactional delivery's transaction (nothing outside
// transactional mode); kept counts the notes that committed.
func (h *harness) note(ctx context.Context, d *rowactor.Delivery, note string) {
	if h.tx {
		h.write(ctx, d, h.sideTable, note)
	}
}

func (h *harness) kept(note string) int {
	h.t.Helper()
	return h.sideRows(h.sideTable, note)
}

// wantKept checks, in transactional mode, which notes committed.
func (h *harness) wantKept(notes map[string]int) {
	h.t.Helper()
	if !h.tx {
		return
	}
	for note, want := range notes {
		if got := h.kept(note); got != want {
			h.t.Fatalf("handler writes %q committed %d times, want %d", note, got, want)
		}
	}
}

// makeDue makes a delayed row due now.
func (h *harness) makeDue(id int64, col string) {
	h.t.Helper()
	h.exec(fmt.Sprintf("UPDATE %s SET %s = ? WHERE id = ?", h.table.Name, col), h.drv.timeValue(time.Now().Add(-time.Second)), id)
}

// fixedDelay is a retry policy returning d, recording what it was asked.
type fixedDelay struct {
	d     time.Duration
	mu    sync.Mutex
	calls []policyCall
}

type policyCall struct {
	attempt int
	err     error
}

func (p *fixedDelay) policy(attempt int, err error) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, policyCall{attempt, err})
	return p.d
}

func (p *fixedDelay) asked() []policyCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]policyCall(nil), p.calls...)
}

func errText(st rowState) string {
	if st.lastError == nil {
		return "<NULL>"
	}
	return *st.lastError
}

var errBoom = errors.New("smtp: 451 mailbox busy")

// notClaimed is how long an outcome scenario watches for a settlement that must not come:
// four polls of the harness's 50 ms interval. A row wrongly left claimable is claimed at
// the next poll (a freed worker claims at once) and its instant handler settles it.
const notClaimed = 200 * time.Millisecond

var outcomeCoreScenarios = []scenario{
	{name: "fail records its error, counts the attempt and waits the policy's delay", shapes: []tableShape{withError, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b, logs := h.captured()
			policy := &fixedDelay{d: time.Hour}
			// A long message of two-byte characters: stored cut to dialects.MaxErrorBytes on a
			// character boundary.
			failErr := fmt.Errorf("%w: %s", errBoom, strings.Repeat("é", 1500))
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				h.note(ctx, d, fmt.Sprint("attempt-", d.Attempt()))
				if d.Attempt() == 1 {
					return rowactor.Fail(failErr)
				}
				return rowactor.Ack()
			}, rowactor.RetryPolicy(policy.policy))
			before := time.Now()
			id := h.publish(b, 1)[0]
			s := h.waitSettled(1)[0]
			if s.Step != "retry_after" || s.Err != nil || s.Outcome.String() != "fail" || !errors.Is(s.HandlerErr, errBoom) {
				t.Fatalf("settlement %+v", s)
			}
			if calls := policy.asked(); len(calls) != 1 || calls[0].attempt != 1 || !errors.Is(calls[0].err, errBoom) {
				t.Fatalf("the policy was asked %+v, want attempt 1 with the handler's error", calls)
			}
			st := h.row(id)
			want := dialects.ErrorText(failErr.Error())
			if errText(st) != want || len(want) > dialects.MaxErrorBytes || len(want) < dialects.MaxErrorBytes-1 || !utf8.ValidString(want) {
				t.Fatalf("error column %q (%d bytes), want the handler's error cut to %d bytes", errText(st), len(errText(st)), dialects.MaxErrorBytes)
			}
			within(t, st.retryAfter, before.Add(time.Hour), time.Minute)
			if st.attempt != attemptColumn(form, 1, 1) || st.lockedUntil != nil || st.processedAt != nil {
				t.Fatalf("row after Fail: %+v", st)
			}
			failed := logs.logged(slog.LevelWarn, "the handler failed")
			if len(failed) != 1 {
				t.Fatalf("%d WARN records of the failure, want 1", len(failed))
			}
			for k, want := range map[string]string{"table": h.table.Name, "queue": h.queue, "id": fmt.Sprint(id), "attempt": "1",
				"form": form.String(), "error": failErr.Error(), "delay": time.Hour.String()} {
				if got := failed[0][k].String(); got != want {
					t.Fatalf("log attribute %s = %q, want %q", k, got, want)
				}
			}
			h.quiet(notClaimed) // an hour away: not claimed
			h.makeDue(id, "retry_after")
			if s := h.waitSettled(1)[0]; s.Step != "ack" || s.Attempt != 2 || s.Err != nil || s.HandlerErr != nil {
				t.Fatalf("second settlement %+v", s)
			}
			// An ack clears the error of the failed attempt: the row kept with processed_at
			// shows none.
			if st := h.row(id); st.processedAt == nil || st.lastError != nil {
				t.Fatalf("row after the ack: %+v, error %q", st, errText(st))
			}
			h.wantKept(map[string]int{"attempt-1": 0, "attempt-2": 1})
		}},
	{name: "fail on a row at its cap moves it and its error to the dead-letter group", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b, logs := h.captured()
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				h.note(ctx, d, "failed")
				return rowactor.Fail(fmt.Errorf("failure %d", d.Attempt()))
			}, rowactor.MaxAttempts(2), rowactor.DeadLetterGroup("dead"), rowactor.RetryPolicy(func(int, error) time.Duration { return 0 }))
			id := h.publish(b, 1)[0]
			got := h.waitDeliveries(2)
			if got[0].Step != "retry_after" || got[1].Step != "dead_letter" || got[1].Err != nil || got[1].HandlerErr.Error() != "failure 2" {
				t.Fatalf("settlements %+v", got)
			}
			h.quiet(notClaimed)
			st := h.row(id)
			if st.group != "dead" || errText(st) != "failure 2" || st.attempt != attemptColumn(form, 2, 1) || st.lockedUntil != nil {
				t.Fatalf("dead-letter row %+v, error %q", st, errText(st))
			}
			spent := logs.logged(slog.LevelWarn, "attempts are spent")
			if len(spent) != 1 || spent[0]["dead_letter"].String() != "dead" || spent[0]["error"].String() != "failure 2" ||
				spent[0]["attempt"].String() != "2" {
				t.Fatalf("dead-letter records %v", spent)
			}
			if n := len(logs.logged(slog.LevelWarn, "the handler failed")); n != 2 {
				t.Fatalf("%d WARN records of failures, want one per Fail (2)", n)
			}
			h.wantKept(map[string]int{"failed": 0})
		}},
	{name: "fail on a row at its cap moves it and its error into the dead-letter table", shapes: []tableShape{withoutGroup, withError},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			dead := h.table
			dead.Name = h.table.Name + "_dead"
			h.createTable(dead)
			b := h.broker()
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Fail(errBoom) },
				rowactor.MaxAttempts(1), rowactor.DeadLetterTable(dead.Name))
			id := h.publish(b, 1)[0]
			if s := h.waitSettled(1)[0]; s.Step != "dead_letter" || s.Err != nil {
				t.Fatalf("settlement %+v", s)
			}
			if h.row(id).exists {
				t.Fatal("row still in the queue table")
			}
			if st := h.drv.state(t, h.d, dead, id); !st.exists || errText(st) != errBoom.Error() || st.lockedUntil != nil {
				t.Fatalf("dead-letter table row %+v, error %q", st, errText(st))
			}
		}},
	{name: "a dead letter without MaxAttempts spends a row's attempts at the default", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			ids := h.publish(b, 2)
			below, at := ids[0], ids[1]
			h.exec(fmt.Sprintf("UPDATE %s SET attempt = ? WHERE id = ?", h.table.Name), rowactor.DefaultMaxAttempts-1, below)
			h.exec(fmt.Sprintf("UPDATE %s SET attempt = ? WHERE id = ?", h.table.Name), rowactor.DefaultMaxAttempts, at)
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Fail(errBoom) },
				rowactor.DeadLetterGroup("dead"), rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour }), rowactor.Workers(2))
			for _, s := range h.waitSettled(2) {
				want := map[int64]string{below: "retry_after", at: "dead_letter"}[s.ID]
				if s.Step != want || s.Err != nil {
					t.Fatalf("settlement %+v, want %s", s, want)
				}
			}
			if st := h.row(below); st.group != h.queue || st.attempt != rowactor.DefaultMaxAttempts || errText(st) != errBoom.Error() {
				t.Fatalf("row below the cap %+v", st)
			}
			if st := h.row(at); st.group != "dead" || errText(st) != errBoom.Error() {
				t.Fatalf("row at the cap %+v", st)
			}
		}},
	{name: "snooze returns the row later without spending an attempt and never dead-letters it", shapes: []tableShape{withError, withProcessedAt},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			var calls atomic.Int64
			h.subscribe(b, func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
				h.note(ctx, d, "snoozed")
				if calls.Add(1) == 1 {
					return rowactor.Snooze(time.Hour).WithError(errors.New("not yet"))
				}
				return rowactor.Ack()
			}, rowactor.MaxAttempts(1), rowactor.DeadLetterGroup("dead")) // a snooze at the cap stays in the queue
			before := time.Now()
			id := h.publish(b, 1)[0]
			s := h.waitSettled(1)[0]
			if s.Step != "snooze" || s.Outcome.String() != "snooze" || s.Err != nil || s.HandlerErr == nil {
				t.Fatalf("settlement %+v", s)
			}
			st := h.row(id)
			within(t, st.retryAfter, before.Add(time.Hour), time.Minute)
			if st.attempt != 1 || st.group != h.queue || st.lockedUntil != nil || errText(st) != "not yet" {
				t.Fatalf("row after Snooze: %+v, error %q", st, errText(st))
			}
			h.quiet(notClaimed)
			h.makeDue(id, "retry_after")
			if s := h.waitSettled(1)[0]; s.Step != "ack" || s.Attempt != 1 || s.Err != nil {
				t.Fatalf("the snoozed row's next delivery %+v, want attempt 1 again", s)
			}
			if st := h.row(id); st.processedAt == nil || st.attempt != attemptColumn(form, 1, 0) {
				t.Fatalf("row after the ack: %+v", st)
			}
			h.wantKept(map[string]int{"snoozed": 1}) // the snooze's write rolled back, the ack's kept
		}},
	{name: "snooze on a table without retry_after waits in the lease, or is refused", shapes: []tableShape{withoutRetryAfter, withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b, logs := h.captured()
			var calls atomic.Int64
			h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
				if calls.Add(1) <= 2 {
					return rowactor.Snooze(time.Hour)
				}
				return rowactor.Ack()
			}, leaseOptions(form, time.Hour)...)
			before := time.Now()
			id := h.publish(b, 1)[0]
			if form == rowactor.FormLease {
				if s := h.waitSettled(1)[0]; s.Step != "snooze" || s.Err != nil {
					t.Fatalf("settlement %+v", s)
				}
				st := h.row(id)
				within(t, st.lockedUntil, before.Add(time.Hour), time.Minute)
				if st.attempt != 1 {
					t.Fatalf("row after Snooze: %+v", st)
				}
				h.quiet(notClaimed)
				return
			}
			// Refused: the row is released unsettled at once, and comes back.
			got := h.waitSettled(3)
			refused := 0
			for _, s := range got {
				var ce *rowactor.ConfigError
				if errors.As(s.Err, &ce) && ce.Option == "Snooze" && s.Released && s.Step == "release" {
					refused++
				}
			}
			if refused < 2 {
				t.Fatalf("settlements %+v, want the snoozes refused with a *ConfigError", got)
			}
			if n := len(logs.logged(slog.LevelWarn, "Snooze is refused")); n != 1 {
				t.Fatalf("%d warnings of the refusal, want 1 per subscription", n)
			}
		}},
	{name: "fail on a table without retry_after waits in the lease, or retries at once with one warning", shapes: []tableShape{withoutRetryAfter, withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b, logs := h.captured()
			var seen sync.Map // attempt -> the error column as the delivery found it
			h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
				seen.Store(d.Attempt(), errText(h.row(d.ID())))
				if d.Attempt() <= 2 {
					return rowactor.Fail(fmt.Errorf("failure %d", d.Attempt()))
				}
				return rowactor.Ack()
			}, rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour }))
			before := time.Now()
			id := h.publish(b, 1)[0]
			if form == rowactor.FormLease {
				if s := h.waitSettled(1)[0]; s.Step != "retry_after" || s.Err != nil {
					t.Fatalf("settlement %+v", s)
				}
				st := h.row(id)
				within(t, st.lockedUntil, before.Add(time.Hour), time.Minute)
				if st.attempt != 2 || errText(st) != "failure 1" {
					t.Fatalf("row after Fail: %+v, error %q", st, errText(st))
				}
				h.quiet(notClaimed)
				return
			}
			got := h.waitDeliveries(3)
			if got[0].Step != "retry" || got[1].Step != "retry" || got[2].Step != "ack" {
				t.Fatalf("settlements %+v", got)
			}
			if e, _ := seen.Load(3); e != "failure 2" {
				t.Fatalf("the third delivery found error %q, want the second's", e)
			}
			if n := len(logs.logged(slog.LevelWarn, "no retry_after column")); n != 1 {
				t.Fatalf("%d warnings of the missing retry_after, want 1 per subscription", n)
			}
			if n := len(logs.logged(slog.LevelWarn, "the handler failed")); n != 2 {
				t.Fatalf("%d WARN records of failures, want 2", n)
			}
		}},
	{name: "a retry with an error records it, one without keeps it, an ack clears it", shapes: []tableShape{withError, withProcessedAt},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			b := h.broker()
			var seen sync.Map
			h.subscribe(b, func(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
				seen.Store(d.Attempt(), errText(h.row(d.ID())))
				switch d.Attempt() {
				case 1:
					return rowactor.Retry().WithError(errors.New("first"))
				case 2:
					return rowactor.Retry()
				}
				return rowactor.Ack()
			})
			id := h.publish(b, 1)[0]
			got := h.waitDeliveries(3)
			if got[0].Step != "retry" || got[0].HandlerErr == nil || got[1].HandlerErr != nil || got[2].Step != "ack" {
				t.Fatalf("settlements %+v", got)
			}
			for attempt, want := range map[int]string{1: "<NULL>", 2: "first", 3: "first"} {
				if e, _ := seen.Load(attempt); e != want {
					t.Fatalf("delivery %d found error %q, want %q", attempt, e, want)
				}
			}
			if st := h.row(id); st.processedAt == nil || st.lastError != nil {
				t.Fatalf("row after the ack %+v, error %q", st, errText(st))
			}
		}},
	{name: "a batch handler's Fail and Snooze settle in the batch's commit", forms: []rowactor.Form{rowactor.FormRowLock}, shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			if h.tx {
				t.Skip("batch handlers cannot be transactional")
			}
			b := h.broker()
			ids := h.publish(b, 2)
			failed, snoozed := ids[0], ids[1]
			before := time.Now()
			_, err := b.SubscribeBatch(context.Background(), h.table, h.queue, 2, func(_ context.Context, ds []*rowactor.Delivery) []rowactor.Outcome {
				out := make([]rowactor.Outcome, len(ds))
				for i, d := range ds {
					out[i] = rowactor.Snooze(time.Hour)
					if d.ID() == failed {
						out[i] = rowactor.Fail(errBoom)
					}
				}
				return out
			}, rowactor.RetryPolicy(func(int, error) time.Duration { return 2 * time.Hour }), rowactor.PollInterval(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range h.waitSettled(2) {
				want := map[int64]string{failed: "retry_after", snoozed: "snooze"}[s.ID]
				if s.Step != want || s.Err != nil {
					t.Fatalf("settlement %+v, want %s", s, want)
				}
			}
			st := h.row(failed)
			within(t, st.retryAfter, before.Add(2*time.Hour), time.Minute)
			if st.attempt != 2 || errText(st) != errBoom.Error() {
				t.Fatalf("failed row %+v, error %q", st, errText(st))
			}
			st = h.row(snoozed)
			within(t, st.retryAfter, before.Add(time.Hour), time.Minute)
			if st.attempt != 1 || st.lastError != nil {
				t.Fatalf("snoozed row %+v, error %q", st, errText(st))
			}
		}},
	{name: "a batched ack clears the error column of every row", forms: []rowactor.Form{rowactor.FormLease}, shapes: []tableShape{withError, withProcessedAt},
		run: func(t *testing.T, h *harness, _ rowactor.Form) {
			ids := h.publish(h.broker(), 3)
			h.exec(fmt.Sprintf("UPDATE %s SET last_error = 'an earlier failure'", h.table.Name))
			q, err := h.d.Open(context.Background(), dialects.QueueSpec{Table: h.table, Group: h.queue})
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			bq, ok := q.(dialects.LeaseBatchQueue)
			if !ok {
				t.Skipf("the %s lease queue does not batch", h.drv.name)
			}
			now := time.Now()
			rows, err := bq.ClaimLeases(context.Background(), now, now.Add(time.Minute), len(ids))
			if err != nil || len(rows) != len(ids) {
				t.Fatalf("claimed %d rows: %v", len(rows), err)
			}
			held := make([]dialects.Lease, len(rows))
			for i, r := range rows {
				held[i] = dialects.Lease{ID: r.ID, Token: r.Token}
			}
			settled, err := bq.SettleLeases(context.Background(), dialects.StepAck, now, held)
			if err != nil || len(settled) != len(ids) {
				t.Fatalf("settled %v: %v", settled, err)
			}
			for _, id := range ids {
				if st := h.row(id); st.processedAt == nil || st.lastError != nil {
					t.Fatalf("row %d after a batched ack: %+v, error %q", id, st, errText(st))
				}
			}
		}},
	{name: "a failed delivery runs an own retry_after event with its error", shapes: []tableShape{withError},
		run: func(t *testing.T, h *harness, form rowactor.Form) {
			b := h.broker()
			set := "retry_after = {at}, last_error = {error}, grp = 'failed'"
			if form == rowactor.FormLease {
				set += ", locked_until = NULL"
			}
			h.subscribe(b, func(context.Context, *rowactor.Delivery) rowactor.Outcome { return rowactor.Fail(errBoom) },
				rowactor.OnEvent("retry_after", "UPDATE "+h.table.Name+" SET "+set+" WHERE id = {id}"),
				rowactor.RetryPolicy(func(int, error) time.Duration { return time.Hour }))
			before := time.Now()
			id := h.publish(b, 1)[0]
			if s := h.waitSettled(1)[0]; s.Step != "retry_after" || s.Event != "retry_after" || s.Err != nil {
				t.Fatalf("settlement %+v", s)
			}
			st := h.row(id)
			within(t, st.retryAfter, before.Add(time.Hour), time.Minute)
			if st.group != "failed" || errText(st) != errBoom.Error() {
				t.Fatalf("row after the own event %+v, error %q", st, errText(st))
			}
		}},
}

// TestOutcomeConformance runs the outcome scenarios over every database, form and mode:
// in transactional mode each handler also writes through its delivery's transaction, and
// the scenario checks that only an Ack kept the write.
func TestOutcomeConformance(t *testing.T) { runModeMatrix(t, outcomeScenarios) }

// runModeMatrix runs scenarios over every (database, form), plain and transactional.
func runModeMatrix(t *testing.T, scenarios []scenario) {
	for _, drv := range drivers {
		for _, form := range drv.forms {
			for _, tx := range []bool{false, true} {
				mode := "plain"
				if tx {
					mode = "transactional"
				}
				for _, sc := range scenarios {
					if sc.forms != nil && !hasForm(sc.forms, form) || tx && sc.plainOnly {
						continue
					}
					t.Run(fmt.Sprintf("%s/%s/%s/%s", drv.name, form, mode, sc.name), func(t *testing.T) {
						t.Parallel()
						h := newHarness(t, drv, form, sc.shapes...)
						if h.tx = tx; tx {
							h.sideTable = h.side()
						}
						sc.run(t, h, form)
					})
				}
			}
		}
	}
}
