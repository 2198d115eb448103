package dashboard

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/headers"
)

// states are the job list's state filter's choices, by their name in the URL.
var states = []struct {
	Name  string
	State dialects.JobState
}{
	{"due", dialects.JobDue}, {"scheduled", dialects.JobDelayed}, {"in-work", dialects.JobInWork}, {"processed", dialects.JobProcessed},
}

func stateName(s dialects.JobState) string {
	for _, x := range states {
		if x.State == s {
			return x.Name
		}
	}
	return s.String()
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
	ErrorLine   string
}

// newJobView is j as the pages show it; dead says j is a row of a dead-letter table,
// which nothing claims: its columns may read "due", but it waits for a requeue.
func newJobView(j dialects.Job, now time.Time, dead bool) jobView {
	v := jobView{Job: j, StateName: stateName(j.State), InWorkKnown: j.InWorkCounted}
	switch {
	case dead && j.State != dialects.JobProcessed:
		v.StateName, v.InWorkKnown, v.DueText = "dead", true, "never: requeue it to run it"
	case j.State == dialects.JobProcessed:
		v.DueText = "finished " + j.ProcessedAt.UTC().Format(time.DateTime)
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

func (d *Dashboard) serveJobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	t, ok := d.table(q.Get("table"))
	if !ok {
		http.Error(w, "dashboard: no such table", http.StatusNotFound)
		return
	}
	p := d.newPage(w, r, "Jobs of "+t.Name)
	p.Refresh = int(d.cfg.refresh / time.Second)
	l := jobList{Table: t, ErrorText: q.Get("error")}
	for _, s := range states {
		l.States = append(l.States, s.Name)
	}
	f := dialects.JobFilter{Limit: d.cfg.pageSize, ErrorContains: l.ErrorText}
	if t.Group != "" && q.Has("group") {
		l.Group, l.HasGroup = q.Get("group"), true
		f.Group, f.HasGroup = l.Group, true
		l.DeadLetterOf = t.deadLetterOf(l.Group)
	}
	if t.deadLetterTableOf != "" {
		l.DeadLetterOf, l.DeadTableOf = t.deadLetterTableOf, t.deadLetterTableOf
	}
	if s := q.Get("state"); s != "" {
		for _, x := range states {
			if x.Name == s {
				f.States, l.State = []dialects.JobState{x.State}, s
			}
		}
	}
	if n, err := strconv.ParseInt(q.Get("min_attempt"), 10, 64); err == nil && n > 1 {
		f.MinAttempt, l.MinAttempt = n, n
	}
	f.AfterID, _ = strconv.ParseInt(q.Get("after"), 10, 64)
	if f.AfterID <= 0 {
		f.BeforeID, _ = strconv.ParseInt(q.Get("before"), 10, 64)
	}
	filter := url.Values{"table": {t.Name}}
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
	l.Filter = template.URL(filter.Encode())
	jobs, err := d.lister.ListJobs(r.Context(), t.Table, f, p.Now)
	if err != nil {
		d.cfg.log.Warn("dashboard: listing jobs failed", "table", t.Name, "err", err)
		p.Error = err.Error()
	}
	for _, j := range jobs {
		l.Jobs = append(l.Jobs, newJobView(j, p.Now, t.deadLetterTableOf != ""))
	}
	// Keyset links from the page's edge ids. A forward page has rows before it when it
	// started after an id, and may have rows after it when full; a backward page the
	// other way round.
	if len(jobs) > 0 {
		first, last := jobs[0].ID, jobs[len(jobs)-1].ID
		full := len(jobs) == f.Limit
		back := f.BeforeID > 0
		if f.AfterID > 0 || (back && full) {
			l.Prev = l.Filter + template.URL("&before="+strconv.FormatInt(first, 10))
		}
		if back || full {
			l.Next = l.Filter + template.URL("&after="+strconv.FormatInt(last, 10))
		}
	}
	p.Data = l
	d.render(w, http.StatusOK, "jobs", p)
}

// jobPage is the job page's data.
type jobPage struct {
	Table        Table
	Job          jobView
	Payload      string
	PayloadJSON  bool
	PayloadBytes int
	Headers      []header
	TraceID      string
	TraceURL     string
	DeadTableOf  string // the table whose dead letters this row is one of (Table.DeadLetterTable)
	DeadLetterOf string
	LeaseUntil   string
	RetryAfter   string
	Subscribed   bool
}

type header struct{ Key, Value string }

// payloadPreview is how many bytes of a payload that is not JSON the page shows in hex.
const payloadPreview = 1024

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
	jp := jobPage{Table: t, Job: newJobView(j, p.Now, t.deadLetterTableOf != ""), PayloadBytes: len(j.Payload)}
	jp.DeadLetterOf, jp.DeadTableOf = t.deadLetterTableOf, t.deadLetterTableOf
	if !j.NullGroup && t.Group != "" {
		jp.DeadLetterOf = t.deadLetterOf(j.Group)
		jp.Subscribed = d.subscription(t, j.Group) != nil
	}
	var pretty bytes.Buffer
	if json.Valid(j.Payload) && json.Indent(&pretty, j.Payload, "", "  ") == nil {
		jp.Payload, jp.PayloadJSON = pretty.String(), true
	} else {
		jp.Payload = hex.Dump(j.Payload[:min(len(j.Payload), payloadPreview)])
	}
	h, _ := headers.Decode(j.Headers) // what can be read of a malformed column
	for k, v := range h {
		jp.Headers = append(jp.Headers, header{k, v})
	}
	sort.Slice(jp.Headers, func(a, b int) bool { return jp.Headers[a].Key < jp.Headers[b].Key })
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
