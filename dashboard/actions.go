package dashboard

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// Actions, by the op field of their form.
const (
	opRetry   = "retry"   // RetryNow of one row (table, id)
	opCancel  = "cancel"  // Cancel of one row (table, id)
	opRequeue = "requeue" // dead letters of a group back into its queue (table, group, [id])
	opPause   = "pause"   // pause this process's subscription (table, group)
	opResume  = "resume"
)

// cancelReason is what Cancel writes into a cancelled row's error column.
const cancelReason = "from the dashboard"

// done is the page an action answers with: what it changed, or why it changed nothing.
type done struct {
	Op      string
	Message string
	Failed  bool
	Back    string // the page to go back to, under Base
}

// serveAction runs one POST action: refused in read-only mode and without a valid CSRF
// token (403 before the form's other fields are looked at), then run through the broker
// (RetryNow, Cancel, Subscription.Pause/Resume) or its dialect (Admin.Requeue).
func (d *Dashboard) serveAction(w http.ResponseWriter, r *http.Request) {
	if d.cfg.readOnly {
		http.Error(w, "dashboard: read-only: actions are turned off", http.StatusForbidden)
		return
	}
	if err := d.crossOrigin(r); err != nil {
		http.Error(w, "dashboard: "+err.Error(), http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !d.csrfOK(r) {
		http.Error(w, "dashboard: missing or invalid CSRF token: reload the page and try again", http.StatusForbidden)
		return
	}
	op := r.PostFormValue("op")
	p := d.newPage(w, r, "Action: "+op)
	t, ok := d.table(r.PostFormValue("table"))
	if !ok {
		http.Error(w, "dashboard: no such table", http.StatusNotFound)
		return
	}
	group := r.PostFormValue("group")
	var id int64
	if s := r.PostFormValue("id"); s != "" {
		var err error
		if id, err = strconv.ParseInt(s, 10, 64); err != nil || id <= 0 {
			http.Error(w, "dashboard: id is not a row id", http.StatusBadRequest)
			return
		}
	}
	res := done{Op: op, Back: "/"}
	if back := r.PostFormValue("back"); len(back) > 0 && back[0] == '/' && (len(back) == 1 || back[1] != '/') && !strings.ContainsAny(back, "\\\r\n") {
		res.Back = back // a path under the mount point only: never another site ("//host", "/\\host")
	}
	if d.destructive(t, op, group, id) && r.PostFormValue("confirm") != "1" {
		// Nothing runs on one click: the page says what would, and its button runs it.
		p.Title = "Confirm: " + op
		p.Data = d.confirmation(r, t, op, group, id, res.Back)
		d.render(w, http.StatusOK, "confirm", p)
		return
	}
	msg, status, err := d.act(r, t, op, group, id)
	if op == opRetry || op == opCancel || op == opRequeue {
		// Even a failed action may have changed a row. A dead-letter table's rows are
		// counted on its queue table's line.
		d.queueCounts.changed(cmp.Or(t.deadLetterTableOf, t.Name))
		d.groupNames.changed(cmp.Or(t.deadLetterTableOf, t.Name))
	}
	switch {
	case err != nil:
		d.cfg.log.Warn("dashboard: an action failed", "op", op, "table", t.Name, "group", group, "id", id, "err", err)
		res.Message, res.Failed = err.Error(), true
	default:
		res.Message = msg
	}
	// Post/redirect/get: the result is kept and shown at a page of its own, so that
	// reloading it shows the result again rather than running the action again.
	key := d.results.keep(res, status)
	http.Redirect(w, r, p.Base+"/done?r="+key, http.StatusSeeOther)
}

// serveDone shows a kept action result, with the status the action answered.
func (d *Dashboard) serveDone(w http.ResponseWriter, r *http.Request) {
	p := d.newPage(w, r, "Action")
	res, status, ok := d.results.get(r.URL.Query().Get("r"))
	if !ok {
		p.Data = done{Message: fmt.Sprintf("This action's result is no longer kept (the dashboard keeps the last %d for %s): the overview shows where the rows stand.", resultsKept, resultsFor),
			Back: "/", Failed: true}
		d.render(w, http.StatusNotFound, "done", p)
		return
	}
	p.Title = "Action: " + res.Op
	p.Data = res
	d.render(w, status, "done", p)
}

// destructive says op cannot be taken back with a click, so it asks first: a cancel (the
// row is deleted, or finished), a requeue of every dead letter (id 0). An action act
// refuses whatever the rows hold (a cancel without a row or of a dead letter, a requeue
// from a group holding no dead letters) is refused at once instead.
func (d *Dashboard) destructive(t Table, op, group string, id int64) bool {
	switch op {
	case opCancel:
		return id != 0 && t.deadLetterTableOf == ""
	case opRequeue:
		return id == 0 && (t.deadLetterTableOf != "" || t.deadLetterOf(group) != "")
	}
	return false
}

// confirm is the confirmation page's data: what the action would do, and the form that
// runs it.
type confirm struct {
	Op, Question, Note, Error string
	Table, Group              string
	ID                        int64
	HasGroup                  bool
	Back                      string
	Label                     string
}

// confirmation says what op would do, counting the dead letters a requeue of every one
// would move (Admin.Requeue's dry run).
func (d *Dashboard) confirmation(r *http.Request, t Table, op, group string, id int64, back string) confirm {
	c := confirm{Op: op, Table: t.Name, Group: group, ID: id, HasGroup: t.Group != "", Back: back}
	switch op {
	case opCancel:
		c.Label = fmt.Sprintf("cancel row %d", id)
		if t.ProcessedAt != "" {
			c.Question = fmt.Sprintf("Cancel row %d of %s? It leaves its queue: kept as cancelled, with %q as its error.", id, t.Name, dialects.CancelledError(cancelReason))
		} else {
			c.Question = fmt.Sprintf("Cancel row %d of %s? It leaves its queue: the table keeps no finished rows, so it is deleted, payload and all.", id, t.Name)
		}
	case opRequeue:
		spec := dialects.RequeueSpec{Table: t.Table, DryRun: true}
		var from, to string
		if t.deadLetterTableOf != "" {
			queue, _ := d.table(t.deadLetterTableOf)
			spec.Table, spec.FromTable = queue.Table, t.Name
			from, to = "table "+t.Name, "table "+queue.Name
		} else {
			spec.FromGroup, spec.ToGroup = group, t.deadLetterOf(group)
			from, to = fmt.Sprintf("group %q of %s", group, t.Name), fmt.Sprintf("queue %q", spec.ToGroup)
		}
		n, err := d.admin.Requeue(r.Context(), spec, nil)
		if err != nil {
			c.Error = err.Error()
		}
		c.Label = fmt.Sprintf("requeue %d dead letter(s)", n)
		c.Question = fmt.Sprintf("Move every dead letter of %s (%d dead letter(s) now) back into %s, due now at attempt 1?", from, n, to)
		c.Note = "This moves all of them: a job list's filter does not narrow it. To move some only, use the requeue button of each row."
	}
	return c
}

// resultsKept and resultsFor bound the action results kept for their pages.
const (
	resultsKept = 256
	resultsFor  = time.Hour
)

// resultStore keeps the last resultsKept action results, each for resultsFor, under a
// random key: the page a POST redirects to.
type resultStore struct {
	mu    sync.Mutex
	m     map[string]keptResult
	order []string
}

type keptResult struct {
	res    done
	status int
	at     time.Time
}

func (s *resultStore) keep(res done, status int) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail (Go 1.24+)
	key := hex.EncodeToString(b[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]keptResult{}
	}
	s.m[key] = keptResult{res: res, status: status, at: time.Now()}
	s.order = append(s.order, key)
	for len(s.order) > resultsKept || (len(s.order) > 0 && time.Since(s.m[s.order[0]].at) > resultsFor) {
		delete(s.m, s.order[0])
		s.order = s.order[1:]
	}
	return key
}

func (s *resultStore) get(key string) (done, int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.m[key]
	if !ok || time.Since(k.at) > resultsFor {
		return done{}, 0, false
	}
	return k.res, k.status, true
}

// act runs op and says what it changed.
func (d *Dashboard) act(r *http.Request, t Table, op, group string, id int64) (string, int, error) {
	ctx := r.Context()
	needID := func() error {
		if id == 0 {
			return errors.New("no row id given")
		}
		return nil
	}
	if t.deadLetterTableOf != "" && (op == opRetry || op == opCancel) {
		// No subscription reads a dead-letter table: a retry there would say a row is
		// due that nothing claims, and a cancelled row would stay a dead letter that the
		// next requeue of the table brings back.
		return "", http.StatusBadRequest, fmt.Errorf("row %d of %s is a dead letter of %s: requeue it, or let RetainDeadLetters delete it; %s acts on queue rows", id, t.Name, t.deadLetterTableOf, op)
	}
	switch op {
	case opRetry:
		if err := needID(); err != nil {
			return "", http.StatusBadRequest, err
		}
		if err := d.b.RetryNow(ctx, t.Table, id); err != nil {
			return "", refusedStatus(err), err
		}
		return fmt.Sprintf("Row %d of %s is due now.", id, t.Name), http.StatusOK, nil
	case opCancel:
		if err := needID(); err != nil {
			return "", http.StatusBadRequest, err
		}
		if err := d.b.Cancel(ctx, t.Table, id, cancelReason); err != nil {
			return "", refusedStatus(err), err
		}
		if t.ProcessedAt != "" {
			return fmt.Sprintf("Row %d of %s is cancelled: kept as cancelled, with %q as its error.", id, t.Name, dialects.CancelledError(cancelReason)), http.StatusOK, nil
		}
		return fmt.Sprintf("Row %d of %s is cancelled: deleted.", id, t.Name), http.StatusOK, nil
	case opRequeue:
		if t.deadLetterTableOf != "" {
			return d.requeueTable(r, t, id)
		}
		queue := t.deadLetterOf(group)
		if queue == "" {
			return "", http.StatusBadRequest, fmt.Errorf("group %q of %s is no dead-letter group the dashboard was told of (Table.DeadLetters)", group, t.Name)
		}
		spec := dialects.RequeueSpec{Table: t.Table, FromGroup: group, ToGroup: queue}
		if id != 0 {
			spec.IDs = []int64{id}
		}
		n, err := d.admin.Requeue(ctx, spec, nil)
		if err != nil {
			return "", refusedStatus(err), err
		}
		return fmt.Sprintf("Moved %d dead letter(s) of %s from group %q back into queue %q.", n, t.Name, group, queue), http.StatusOK, nil
	case opPause, opResume:
		s := d.subscription(t, group)
		if s == nil {
			return "", http.StatusNotFound, fmt.Errorf("no subscription of this process reads queue %q of %s", group, t.Name)
		}
		if op == opPause {
			if err := s.Pause(ctx); err != nil {
				return "", http.StatusInternalServerError, err
			}
			return fmt.Sprintf("Paused this process's subscription to queue %q of %s: it claims no more rows; rows in work settle as usual.", group, t.Name), http.StatusOK, nil
		}
		if err := s.Resume(ctx); err != nil {
			return "", http.StatusInternalServerError, err
		}
		return fmt.Sprintf("Resumed this process's subscription to queue %q of %s.", group, t.Name), http.StatusOK, nil
	}
	return "", http.StatusBadRequest, fmt.Errorf("unknown action %q", op)
}

// requeueTable moves the dead letters of dead-letter table dead (one, or all with id 0)
// back into its queue table.
func (d *Dashboard) requeueTable(r *http.Request, dead Table, id int64) (string, int, error) {
	queue, ok := d.table(dead.deadLetterTableOf)
	if !ok {
		return "", http.StatusNotFound, fmt.Errorf("no queue table %s", dead.deadLetterTableOf)
	}
	spec := dialects.RequeueSpec{Table: queue.Table, FromTable: dead.Name}
	if id != 0 {
		spec.IDs = []int64{id}
	}
	n, err := d.admin.Requeue(r.Context(), spec, nil)
	if err != nil {
		return "", refusedStatus(err), err
	}
	return fmt.Sprintf("Moved %d dead letter(s) from table %s back into %s.", n, dead.Name, queue.Name), http.StatusOK, nil
}

// refusedStatus is the status of an action the row's state refused (409), or a failure.
func refusedStatus(err error) int {
	var ce *dialects.ConfigError
	switch {
	case errors.Is(err, rowactor.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, rowactor.ErrInWork), errors.Is(err, rowactor.ErrFinished), errors.Is(err, dialects.ErrRequeueRace):
		return http.StatusConflict
	case errors.As(err, &ce):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}
