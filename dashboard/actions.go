package dashboard

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

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
const cancelReason = "cancelled from the dashboard"

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
	msg, status, err := d.act(r, t, op, group, id)
	if op == opRetry || op == opCancel || op == opRequeue {
		// Even a failed action may have changed a row. A dead-letter table's rows are
		// counted on its queue table's line.
		d.queueCounts.changed(cmp.Or(t.deadLetterTableOf, t.Name))
	}
	switch {
	case err != nil:
		d.cfg.log.Warn("dashboard: an action failed", "op", op, "table", t.Name, "group", group, "id", id, "err", err)
		res.Message, res.Failed = err.Error(), true
	default:
		res.Message = msg
	}
	p.Data = res
	d.render(w, status, "done", p)
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
			return fmt.Sprintf("Row %d of %s is cancelled: marked processed, with %q as its error.", id, t.Name, cancelReason), http.StatusOK, nil
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
