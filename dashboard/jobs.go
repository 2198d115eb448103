package dashboard

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/headers"
)

// states are the states' names on the pages and in the job list's URL.
var states = []struct {
	Name  string
	State dialects.JobState
}{
	{"due", dialects.JobDue}, {"scheduled", dialects.JobDelayed}, {"in-work", dialects.JobInWork}, {"dead", dialects.JobDead},
	{"processed", dialects.JobProcessed}, {"cancelled", dialects.JobCancelled},
}

func stateName(s dialects.JobState) string {
	for _, x := range states {
		if x.State == s {
			return x.Name
		}
	}
	return s.String()
}

// stateChoice is one choice of the job list's state filter: its name, and the states of
// the rows it keeps.
type stateChoice struct {
	Name   string
	States []dialects.JobState
}

// stateChoices are the state filter's choices on a list of t, whose rows are dead
// letters where dead says so (a dead-letter group or table). Their rows that are not in
// work or processed show as dead (newJobView), so "dead" keeps them all there, and
// "due" and "scheduled" are no choice. Elsewhere "dead" is a choice where the table
// describes DeadAt, which tells a dead row.
func stateChoices(t Table, dead bool) []stateChoice {
	var out []stateChoice
	for _, x := range states {
		switch {
		case dead && (x.State == dialects.JobDue || x.State == dialects.JobDelayed):
			continue
		case dead && x.State == dialects.JobDead:
			out = append(out, stateChoice{x.Name, []dialects.JobState{dialects.JobDead, dialects.JobDue, dialects.JobDelayed}})
			continue
		case x.State == dialects.JobDead && t.DeadAt == "":
			continue
		case x.State == dialects.JobCancelled && (t.ProcessedAt == "" || t.Error == ""):
			continue // no row reads as cancelled there: it is deleted, or reads processed
		}
		out = append(out, stateChoice{x.Name, []dialects.JobState{x.State}})
	}
	return out
}

// rowDeadLetterOf names, for row j of t, what it is a dead letter of: the queue of its
// dead-letter group (Table.DeadLetters), or the queue table of a dead-letter table; ""
// for a row of a queue.
func (t Table) rowDeadLetterOf(j dialects.Job) string {
	switch {
	case t.deadLetterTableOf != "":
		return t.deadLetterTableOf
	case t.Group != "" && !j.NullGroup:
		return t.deadLetterOf(j.Group)
	}
	return ""
}

// jobList is the job list page's data.
type jobList struct {
	Table        Table
	Group        string
	HasGroup     bool
	DeadLetterOf string // the queue whose dead letters this group holds
	DeadTableOf  string // the table whose dead letters this table holds (Table.DeadLetterTable)
	State        string
	MinAttempt   int64
	ErrorText    string
	States       []string
	Jobs         []jobView
	// Prev and Next are the neighbouring pages' queries, "" at an end; Filter the
	// filter's, for the links back to this list. template.URL: built by url.Values and
	// strconv only, they are put in an href as they are.
	Prev, Next template.URL
	Filter     template.URL
}

// jobView is one row as the list and the job page show it.
type jobView struct {
	dialects.Job
	StateName   string
	InWorkKnown bool
	DueText     string
	// DiedText is when a dead row died (its DeadAt); "" when the row keeps no time.
	DiedText  string
	ErrorLine string
	// DeadLetterOf is the queue (or queue table) this row is a dead letter of, which a
	// requeue moves it back into; "" for a queue's row, or a dead row whose queue the
	// dashboard was not told of.
	DeadLetterOf string
}

// newJobView is j, a row of t, as the pages show it. A row is dead when the database
// says so (its DeadAt is set), and when it waits in a dead-letter group or table the
// dashboard was told of (Table.DeadLetters, Table.DeadLetterTable), neither in work nor
// processed: its columns may read "due" (moved before the table described DeadAt), but
// nothing claims it until a requeue.
func newJobView(j dialects.Job, now time.Time, t Table) jobView {
	v := jobView{Job: j, StateName: stateName(j.State), InWorkKnown: j.InWorkCounted, DeadLetterOf: t.rowDeadLetterOf(j)}
	dead := j.State == dialects.JobDead ||
		(v.DeadLetterOf != "" && (j.State == dialects.JobDue || j.State == dialects.JobDelayed))
	switch {
	case dead:
		v.StateName, v.InWorkKnown, v.DueText = "dead", true, "never: requeue it to run it"
		if !j.DeadAt.IsZero() {
			v.DiedText = "died " + j.DeadAt.UTC().Format(time.DateTime) + " UTC, " + roundAge(now.Sub(j.DeadAt)) + " ago"
		}
	case j.State == dialects.JobProcessed:
		v.DueText = "finished " + j.ProcessedAt.UTC().Format(time.DateTime)
	case j.State == dialects.JobCancelled:
		v.DueText = "cancelled " + j.ProcessedAt.UTC().Format(time.DateTime)
	case j.State == dialects.JobDelayed:
		v.DueText = "in " + roundAge(j.RetryAfter.Sub(now))
	case j.State == dialects.JobInWork:
		v.DueText = "leased for " + roundAge(j.LockedUntil.Sub(now))
	default:
		v.DueText = "now"
	}
	v.ErrorLine = oneLine(j.Error, 120)
	return v
}

// serveJobs is the job list of one table: its query names the filter and the page.
func (d *Dashboard) serveJobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	t, ok := d.table(q.Get("table"))
	if !ok {
		http.Error(w, "dashboard: no such table", http.StatusNotFound)
		return
	}
	p := d.newPage(w, r, "Jobs of "+t.Name)
	p.Refresh = int(d.cfg.refresh / time.Second)
	l, f, err := d.parseJobQuery(q, t)
	l.Filter = jobFilterQuery(l)
	if err != nil {
		// Input the list cannot use is named on the page, never handed to the database
		// (whose driver would answer in its own words, or read it as no filter).
		p.Error, p.Data = err.Error(), l
		d.render(w, http.StatusBadRequest, "jobs", p)
		return
	}
	d.loadJobs(r.Context(), t, f, &p, &l)
	p.Data = l
	d.render(w, http.StatusOK, "jobs", p)
}

// parseJobQuery reads the job list's query into the page's data and the database's
// filter. Its error is the first parameter the list cannot use.
func (d *Dashboard) parseJobQuery(q url.Values, t Table) (jobList, dialects.JobFilter, error) {
	l := jobList{Table: t, ErrorText: q.Get("error")}
	f := dialects.JobFilter{Limit: d.cfg.pageSize, ErrorContains: l.ErrorText}
	if t.Group != "" && q.Has("group") {
		l.Group, l.HasGroup = q.Get("group"), true
		f.Group, f.HasGroup = l.Group, true
		l.DeadLetterOf = t.deadLetterOf(l.Group)
	}
	if t.deadLetterTableOf != "" {
		l.DeadLetterOf, l.DeadTableOf = t.deadLetterTableOf, t.deadLetterTableOf
	}
	choices := stateChoices(t, l.DeadLetterOf != "")
	for _, c := range choices {
		l.States = append(l.States, c.Name)
	}
	err := parseStateFilter(q, choices, &l, &f)
	if e := parseMinAttempt(q, &l, &f); err == nil {
		err = e
	}
	if e := parseKeyset(q, &f); err == nil {
		err = e
	}
	return l, f, err
}

// parseStateFilter reads the state parameter, one of choices; "" is every state.
func parseStateFilter(q url.Values, choices []stateChoice, l *jobList, f *dialects.JobFilter) error {
	s := q.Get("state")
	if s == "" {
		return nil
	}
	for _, c := range choices {
		if c.Name == s {
			f.States, l.State = c.States, s
		}
	}
	if l.State == "" {
		return fmt.Errorf("state %q is no state: pick one of %s, or none for every state", s, strings.Join(l.States, ", "))
	}
	return nil
}

// parseMinAttempt reads the min_attempt parameter; "", 0 and 1 filter nothing.
func parseMinAttempt(q url.Values, l *jobList, f *dialects.JobFilter) error {
	s := q.Get("min_attempt")
	if s == "" {
		return nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil || n < 0 || n > maxAttemptFilter:
		return fmt.Errorf("min_attempt %q is not a whole number from 1 to %d (attempts count from 1; leave it empty for every attempt)", s, maxAttemptFilter)
	case n > 1:
		f.MinAttempt, l.MinAttempt = n, n
	}
	return nil
}

// parseKeyset reads the after and before row ids of a page link; after wins when both
// are given. Its error is the first id that is not one.
func parseKeyset(q url.Values, f *dialects.JobFilter) error {
	var first error
	for _, e := range []struct {
		name string
		into *int64
	}{{"after", &f.AfterID}, {"before", &f.BeforeID}} {
		if s := q.Get(e.name); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n <= 0 {
				if first == nil {
					first = fmt.Errorf("%s %q is not a row id (a whole number from 1 to %d)", e.name, s, int64(math.MaxInt64))
				}
				continue
			}
			*e.into = n
		}
	}
	if f.AfterID > 0 {
		f.BeforeID = 0
	}
	return first
}

// jobFilterQuery is the query of the list's filter, without its page: the links back to
// this list start from it.
func jobFilterQuery(l jobList) template.URL {
	filter := url.Values{"table": {l.Table.Name}}
	if l.HasGroup {
		filter.Set("group", l.Group)
	}
	for k, v := range map[string]string{"state": l.State, "error": l.ErrorText} {
		if v != "" {
			filter.Set(k, v)
		}
	}
	if l.MinAttempt > 1 {
		filter.Set("min_attempt", strconv.FormatInt(l.MinAttempt, 10))
	}
	return template.URL(filter.Encode())
}

// loadJobs reads the page of rows f asks for into l, with the links to its neighbours.
// A database error is logged and named on the page.
func (d *Dashboard) loadJobs(ctx context.Context, t Table, f dialects.JobFilter, p *page, l *jobList) {
	jobs, prev, next, err := d.listPage(ctx, t, f, p.Now)
	if err != nil {
		d.cfg.log.Warn("dashboard: listing jobs failed", "table", t.Name, "err", err)
		p.Error = err.Error()
	}
	for _, j := range jobs {
		l.Jobs = append(l.Jobs, newJobView(j, p.Now, t))
	}
	// Keyset links from the page's edge ids, each only where a row lies beyond that edge.
	if prev {
		l.Prev = l.Filter + template.URL("&before="+strconv.FormatInt(jobs[0].ID, 10))
	}
	if next {
		l.Next = l.Filter + template.URL("&after="+strconv.FormatInt(jobs[len(jobs)-1].ID, 10))
	}
}

// maxAttemptFilter is the largest attempt a job list filters on: an attempt column is an
// INTEGER (32 bits on PostgreSQL and MySQL), and no row is tried that often.
const maxAttemptFilter = math.MaxInt32

// listPage reads one page of f and whether rows lie before and after it: the page is read
// with one row more than it shows, which tells whether a row lies beyond it in the
// direction read; a one-row read the other way from its edge tells the other side.
func (d *Dashboard) listPage(ctx context.Context, t Table, f dialects.JobFilter, now time.Time) (jobs []dialects.Job, prev, next bool, err error) {
	limit := f.Limit
	f.Limit = limit + 1
	jobs, err = d.lister.ListJobs(ctx, t.Table, f, now)
	if err != nil || len(jobs) == 0 {
		return nil, false, false, err
	}
	back := f.BeforeID > 0
	beyond := len(jobs) > limit
	if beyond {
		if back { // read downwards from BeforeID, returned in id order: the extra row is the first
			jobs = jobs[1:]
		} else {
			jobs = jobs[:limit]
		}
	}
	other := false
	if f.AfterID > 0 || back {
		o := f
		o.Limit, o.AfterID, o.BeforeID = 1, 0, 0
		if back {
			o.AfterID = jobs[len(jobs)-1].ID
		} else {
			o.BeforeID = jobs[0].ID
		}
		rows, err := d.lister.ListJobs(ctx, t.Table, o, now)
		if err != nil {
			return nil, false, false, err
		}
		other = len(rows) > 0
	}
	if back {
		return jobs, beyond, other, nil
	}
	return jobs, other, beyond, nil
}

// jobPage is the job page's data.
type jobPage struct {
	Table        Table
	Job          jobView
	Payload      preview
	PayloadBytes int
	// ErrorText is the error column, cut to errorPreviewBytes (ErrorCut).
	ErrorText string
	ErrorCut  bool
	Headers   []header
	// HeadersLeft is how many headers past headersShown the page leaves out.
	HeadersLeft  int
	TraceID      string
	TraceURL     string
	DeadTableOf  string // the table whose dead letters this row is one of (Table.DeadLetterTable)
	DeadLetterOf string
	LeaseUntil   string
	RetryAfter   string
	Subscribed   bool
}

// header is one header as the page shows it: Cut says its key or value is cut to
// headerPreviewBytes.
type header struct {
	Key, Value string
	Cut        bool
}

func (d *Dashboard) serveJob(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	t, ok := d.table(q.Get("table"))
	if !ok {
		http.Error(w, "dashboard: no such table", http.StatusNotFound)
		return
	}
	id, err := strconv.ParseInt(q.Get("id"), 10, 64)
	if err != nil || id <= 0 {
		http.Error(w, "dashboard: id is not a row id", http.StatusBadRequest)
		return
	}
	p := d.newPage(w, r, "Job "+strconv.FormatInt(id, 10)+" of "+t.Name)
	j, err := d.b.Inspect(r.Context(), t.Table, id)
	if errors.Is(err, dialects.ErrRowNotFound) {
		p.Error = err.Error()
		d.render(w, http.StatusNotFound, "job", p)
		return
	}
	if err != nil {
		d.cfg.log.Warn("dashboard: inspecting a row failed", "table", t.Name, "id", id, "err", err)
		p.Error = err.Error()
		d.render(w, http.StatusInternalServerError, "job", p)
		return
	}
	jp := jobPage{Table: t, Job: newJobView(j, p.Now, t), PayloadBytes: len(j.Payload)}
	jp.DeadLetterOf, jp.DeadTableOf = jp.Job.DeadLetterOf, t.deadLetterTableOf
	if !j.NullGroup && t.Group != "" {
		jp.Subscribed = d.subscription(t, j.Group) != nil
	}
	jp.Payload = payloadPreview(j.Payload)
	jp.ErrorText, jp.ErrorCut = cutText(j.Error, errorPreviewBytes)
	h, _ := headers.Decode(j.Headers) // what can be read of a malformed column
	for k, v := range h {
		value, cut := cutText(v, headerPreviewBytes)
		key, keyCut := cutText(k, headerPreviewBytes)
		jp.Headers = append(jp.Headers, header{Key: key, Value: value, Cut: cut || keyCut})
	}
	sort.Slice(jp.Headers, func(a, b int) bool { return jp.Headers[a].Key < jp.Headers[b].Key })
	if len(jp.Headers) > headersShown {
		jp.HeadersLeft = len(jp.Headers) - headersShown
		jp.Headers = jp.Headers[:headersShown]
	}
	if id := traceID(h["traceparent"]); id != "" {
		jp.TraceID = id
		if d.cfg.traceURL != "" {
			jp.TraceURL = strings.ReplaceAll(d.cfg.traceURL, "{trace_id}", id)
		}
	}
	if !j.LockedUntil.IsZero() {
		jp.LeaseUntil = j.LockedUntil.UTC().Format(time.RFC3339)
	}
	if !j.RetryAfter.IsZero() {
		jp.RetryAfter = j.RetryAfter.UTC().Format(time.RFC3339)
	}
	p.Data = jp
	d.render(w, http.StatusOK, "job", p)
}

// traceID is a W3C traceparent's trace id ("00-<32 hex>-<16 hex>-<2 hex>"), or "".
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) < 4 || len(parts[1]) != 32 || strings.Trim(parts[1], "0") == "" {
		return ""
	}
	if _, err := hex.DecodeString(parts[1]); err != nil {
		return ""
	}
	return parts[1]
}

// oneLine keeps a text on one line, cut to n characters with an ellipsis.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return s
}

// roundAge prints a duration to a useful precision.
func roundAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < 24*time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
