// Package dashboard is rowactor's operator dashboard: an http.Handler a service mounts on
// its own mux, showing its queue tables (queues, jobs, errors, throughput) and offering
// the operator's actions (retry now, cancel, requeue dead letters, pause and resume).
//
//	d, err := dashboard.New(broker, []dashboard.Table{{Table: emails,
//		DeadLetters: map[string]string{"emails": "emails-dead"}}})
//	mux.Handle("/admin/queues/", http.StripPrefix("/admin/queues", d))
//
// Pages are rendered on the server from html/template; the stylesheet and the one small
// script (the auto-refresh) are embedded, so nothing is built and nothing is fetched from
// elsewhere. Links are made from the request's own prefix, so the handler works under any
// mount point, with http.StripPrefix or at the root.
//
// Everything the dashboard reads or writes goes through the broker and its dialect's
// interfaces (dialects.Admin, Inspector, JobLister, FinishedCounter): it never asks which
// database it is on. With a broker whose subscriptions run in this process, the chart of
// a queue they read counts their settlements (Broker.Throughput) and the overview can
// pause and resume them; the chart of any other group (a queue consumed elsewhere, a
// dead-letter group, which no subscription reads) counts finished rows by processed_at,
// where the table has it and an index of the table leads with processed_at. Schema renders
// no such index (claims never need it), and without one the count would read the whole
// table on every refresh: the overview then draws no chart for those groups, names them,
// and shows the dialect's statement that creates the index
// (FinishedCounter.FinishedIndexStatement), and, when no subscription of this process
// reads the table, the other way out: mounting the dashboard in the service that runs
// them. Whether the index exists is read at most once per IndexRecheck and table, so a new
// index shows the chart within a minute.
//
// The overview has a line for every group that has rows, finished ones included, and for
// every queue a subscription of this process reads, with zeros where nothing is queued.
// Dead letters (rows whose DeadAt is set, and the unfinished rows of a dead-letter group
// or table the dashboard is told of) are counted as dead, never as due, and show as dead
// in job lists and job pages, with their time of death and a requeue.
//
// What an open page costs: the overview counts only the unfinished rows, through the
// claim index (dialects.QueueCounter), so a table keeping a million finished rows costs
// what its queue costs. A queue that takes 100 ms or more to count (a million rows
// queued: about 400 ms) has its count kept, shown with its age, for 100 times as long as
// it took (10 s to 15 min), and counted again in the background: pages never wait for it
// again, and an open dashboard spends about 1% of a connection counting; an action on the
// table makes it due. A render waits for a count at most 2 s, as for the chart's first
// read of its hour, then says the numbers come at the next refresh. Counts and chart
// reads left running in the background end when the broker's Shutdown begins. Job lists are keyset pages of the primary key (of the claim
// index, filtered to unfinished states). The chart by processed_at, given its index,
// reads the whole hour of finished rows once, then only the last two minutes on each
// refresh, one statement per table. One overview statement reads the finished rows: the
// groups they are in (dialects.GroupLister), since the claim index leaves them out on
// PostgreSQL and SQLite; it is read at most once a minute per table, in the background,
// and kept 100 times as long as it took when that is longer (up to 15 min). Pages reload at
// most every MinRefresh.
//
// Actions are POST requests carrying a token bound to a cookie (SameSite=Strict) by an
// HMAC under a secret each Dashboard draws at New; ReadOnly refuses them all. A POST a
// browser marks as coming from another origin is refused before its token is read, and
// AllowHosts refuses requests for host names other than the dashboard's own (DNS
// rebinding). A cancel and a requeue of every dead letter ask first; an action answers
// 303 to its kept result, so reloading the result runs nothing again.
//
// What a page holds is bounded whatever the rows hold: job lists read no payload and no
// headers (dialects.JobLister), a job page's previews are cut (preview.go: JSON indented
// to 64 KB and 32 levels, text to 64 KB, other bytes to 1 KB of hex, and says so), and a
// table's overview shows at most overviewGroups groups.
package dashboard

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// Table is a queue table the dashboard shows.
type Table struct {
	rowactor.Table
	// DeadLetters maps a queue (a group of the table) to the group its dead letters move
	// to (the subscription's DeadLetterGroup): the overview counts that group's unfinished
	// rows as the queue's dead letters, the pages show them as dead (even those whose
	// DeadAt is NULL), and "requeue" moves them back into the queue. Needs the table's
	// group column. Without it a row whose DeadAt is set still shows as dead, with no
	// requeue: the dashboard knows no queue to move it back to.
	DeadLetters map[string]string
	// DeadLetterTable is the table a table without groups moves its dead letters to (the
	// subscription's DeadLetterTable; it has the queue table's columns): the overview
	// counts its rows, its job list lists them, and "requeue" moves them back.
	DeadLetterTable string
	// deadLetterTableOf is, for the entry of a dead-letter table (which the overview
	// does not show as a table of its own), the queue table whose dead letters it holds.
	deadLetterTableOf string
}

// Option configures a Dashboard.
type Option func(*config)

type config struct {
	readOnly bool
	traceURL string
	refresh  time.Duration
	pageSize int
	log      *slog.Logger
	now      func() time.Time
	// indexRecheck is how long a table's check for an index on processed_at holds
	// (IndexRecheck; tests shorten it).
	indexRecheck time.Duration
	// count weighs the overview's counts (countCache; tests shorten it).
	count countPolicy
	// hostCheck turns on AllowHosts' check, hosts are its names (lower case).
	hostCheck bool
	hosts     map[string]bool
}

// ReadOnly refuses every action (403) and shows no action's button.
func ReadOnly() Option { return func(c *config) { c.readOnly = true } }

// TraceURL links a job's trace id (from its traceparent header) to a tracing UI: the
// template's {trace_id} is replaced, e.g. "http://jaeger:16686/trace/{trace_id}".
// Defaults to no link: the trace id is shown as text.
func TraceURL(template string) Option { return func(c *config) { c.traceURL = template } }

// Refresh is how often the overview and job lists reload themselves while visible;
// shorter than MinRefresh is raised to it, and 0 turns the reload off. Defaults to
// DefaultRefresh.
func Refresh(d time.Duration) Option { return func(c *config) { c.refresh = d } }

// PageSize is how many jobs a job list's page shows. Defaults to dialects.DefaultJobPage.
func PageSize(n int) Option { return func(c *config) { c.pageSize = n } }

// WithLogger is where the dashboard logs what fails while it renders a page (the page
// shows the error too). Defaults to the broker's quiet default: warnings only.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithClock sets the dashboard's "now" (ages, due times): tests stub it. Defaults to
// time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// AllowHosts refuses (403) every request whose Host header names a host other than
// names, a localhost name (localhost, *.localhost) or an IP address: the defence against
// DNS rebinding, where a page of another site, its name pointed at the dashboard's
// address, reads the dashboard (and its CSRF token) as its own origin. A POST's Origin,
// when sent, must name such a host too. Ports are not compared. Without AllowHosts the
// dashboard answers any Host: the service mounting it may check hosts itself, behind a
// proxy that sets them; `rowactor serve` always turns the check on (-allow-host adds
// names). A dashboard reachable on a loopback or private address without a check of its
// own in front should use it.
func AllowHosts(names ...string) Option {
	return func(c *config) {
		c.hostCheck = true
		if c.hosts == nil {
			c.hosts = map[string]bool{}
		}
		for _, n := range names {
			c.hosts[hostName(n)] = true
		}
	}
}

// hostName is the host of a Host header or a name given to AllowHosts: without its port,
// brackets or trailing dot, in lower case.
func hostName(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	return strings.ToLower(host)
}

// hostAllowed says AllowHosts lets a request for hostport in. An IP address is always
// let in: rebinding needs a name (a browser sends the Host of the page's own URL, so an
// address there means the page came from this server); so is a localhost name, which
// resolves to this machine by rule, never by an attacker's DNS.
func (c *config) hostAllowed(hostport string) bool {
	if !c.hostCheck {
		return true
	}
	host := hostName(hostport)
	if host == "" || net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	return c.hosts[host]
}

// MinRefresh and DefaultRefresh bound the pages' auto-refresh: an open page costs the
// database its overview statements at most once per MinRefresh.
const (
	MinRefresh     = 5 * time.Second
	DefaultRefresh = 10 * time.Second
)

// IndexRecheck is how often the dashboard reads, per table, whether an index leads with
// processed_at (the chart by processed_at needs one): an index created meanwhile shows
// the chart within this long.
const IndexRecheck = time.Minute

// Dashboard is the dashboard's http.Handler.
type Dashboard struct {
	b      *rowactor.Broker
	tables []Table
	// deadTables are the tables' dead-letter tables (Table.DeadLetterTable): their job
	// lists and job pages are served, the overview counts them on their queue's line.
	deadTables []Table
	cfg        config
	secret     []byte // the CSRF tokens' HMAC key, drawn at New
	pages      map[string]*template.Template
	static     http.Handler

	admin    dialects.Admin
	lister   dialects.JobLister
	finished finishedCache // the chart's counts by processed_at, read a minute or two at a time
	indexes  indexCache    // whether each table has an index leading with processed_at
	// queueCounts keeps the overview's counts of tables whose count is slow.
	queueCounts countCache
	// groupNames keeps the groups of each table's finished rows (dialects.GroupLister),
	// read at most once per groupsKeepMin.
	groupNames countCache
	charts     chartReads // the chart's reads, a render waiting for them at most the count's wait
	// results keeps action results for the page a POST redirects to.
	results resultStore
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New returns the dashboard of tables, read and changed through b. The tables are
// checked as no database is needed to (a live table that differs is reported on its
// page). A broker over a dialect of the service's own is one rowactor.New away; the
// dashboard never shuts it down.
func New(b *rowactor.Broker, tables []Table, opts ...Option) (*Dashboard, error) {
	if b == nil {
		return nil, errors.New("dashboard: New needs a broker (rowactor.Open, or rowactor.New over a dialect)")
	}
	d := &Dashboard{b: b, tables: tables, cfg: config{refresh: DefaultRefresh, pageSize: dialects.DefaultJobPage, now: time.Now, indexRecheck: IndexRecheck,
		count: defaultCount}}
	for _, o := range opts {
		o(&d.cfg)
	}
	if d.cfg.refresh > 0 && d.cfg.refresh < MinRefresh {
		d.cfg.refresh = MinRefresh
	}
	if d.cfg.pageSize <= 0 {
		d.cfg.pageSize = dialects.DefaultJobPage
	}
	if d.cfg.log == nil {
		d.cfg.log = slog.New(warnOnly{slog.Default().Handler()})
	}
	var ok bool
	dl := b.Dialect()
	if d.admin, ok = dl.(dialects.Admin); !ok {
		return nil, fmt.Errorf("dashboard: the %s dialect cannot count a table's rows (dialects.Admin)", dl.Name())
	}
	if d.lister, ok = dl.(dialects.JobLister); !ok {
		return nil, fmt.Errorf("dashboard: the %s dialect cannot list a table's rows (dialects.JobLister)", dl.Name())
	}
	seen := map[string]bool{}
	fc, _ := dl.(dialects.FormChecker)
	for _, t := range tables {
		if err := dialects.CheckDescription(t.Table); err != nil {
			return nil, fmt.Errorf("dashboard: %w", err)
		}
		if fc != nil {
			// A form the database cannot serve: no subscription consumes such a table,
			// and every action on it would fail. Refused as Subscribe refuses it.
			if err := fc.CheckForm(t.Table); err != nil {
				return nil, fmt.Errorf("dashboard: %w", err)
			}
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("dashboard: table %s is named twice", t.Name)
		}
		seen[t.Name] = true
		if len(t.DeadLetters) > 0 && t.Group == "" {
			return nil, &dialects.ConfigError{Table: t.Name, Option: "DeadLetters",
				Reason: "dead-letter groups need the table's group column", Fix: "name Table.Group, or drop DeadLetters"}
		}
		if t.DeadLetterTable == "" {
			continue
		}
		if t.Group != "" {
			return nil, &dialects.ConfigError{Table: t.Name, Option: "DeadLetterTable",
				Reason: "a table with a group column keeps its dead letters in a group", Fix: "name the dead-letter group in DeadLetters, or drop DeadLetterTable"}
		}
		if err := dialects.CheckDeadLetterName(t.Table, t.DeadLetterTable, true); err != nil {
			return nil, fmt.Errorf("dashboard: %w", err)
		}
		dead := t.Table
		dead.Name = t.DeadLetterTable
		d.deadTables = append(d.deadTables, Table{Table: dead, deadLetterTableOf: t.Name})
	}
	// Dead-letter tables are compared without case, as a requeue from one compares it
	// with its queue table (dialects.CheckDeadLetterName): MySQL and SQLite fold names.
	folded := map[string]bool{}
	for name := range seen {
		folded[strings.ToLower(name)] = true
	}
	for _, t := range d.deadTables {
		if folded[strings.ToLower(t.Name)] {
			return nil, &dialects.ConfigError{Table: t.deadLetterTableOf, Option: "DeadLetterTable",
				Reason: fmt.Sprintf("table %s is named as a dead-letter table and as a table to show, or as the dead-letter table of two tables", t.Name),
				Fix:    "give each queue table a dead-letter table of its own, and do not list it among the tables"}
		}
		folded[strings.ToLower(t.Name)] = true
	}
	d.secret = make([]byte, 32)
	if _, err := rand.Read(d.secret); err != nil {
		return nil, fmt.Errorf("dashboard: CSRF secret: %w", err)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	d.pages = pages
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	d.static = http.StripPrefix("/static/", http.FileServerFS(sub))
	return d, nil
}

// parsePages parses each page with the layout it fills.
func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "jobs", "job", "done", "confirm"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// ServeHTTP routes the dashboard's pages. Paths are the mount point's own: "/" is the
// overview whatever prefix the service strips before.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
	if !d.cfg.hostAllowed(r.Host) {
		http.Error(w, fmt.Sprintf("dashboard: host %q is not one this dashboard serves: open it by its address, localhost, or a name it allows (AllowHosts; rowactor serve -allow-host)", hostName(r.Host)), http.StatusForbidden)
		return
	}
	path := r.URL.Path
	switch {
	case strings.HasPrefix(path, "/static/"):
		w.Header().Set("Cache-Control", "max-age=3600")
		d.static.ServeHTTP(w, r)
		return
	case r.Method == http.MethodPost && path == "/action":
		d.serveAction(w, r)
		return
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch path {
	case "", "/":
		d.serveOverview(w, r)
	case "/jobs":
		d.serveJobs(w, r)
	case "/job":
		d.serveJob(w, r)
	case "/done":
		d.serveDone(w, r)
	default:
		http.NotFound(w, r)
	}
}

// page is what every page's layout reads.
type page struct {
	Title    string
	Base     string // the mount prefix, without a trailing slash
	CSRF     string
	ReadOnly bool
	Refresh  int // seconds; 0: no auto-refresh
	Now      time.Time
	Error    string
	Data     any
}

// newPage fills the layout's fields for r, and sets the CSRF cookie when r has none.
func (d *Dashboard) newPage(w http.ResponseWriter, r *http.Request, title string) page {
	p := page{Title: title, Base: base(r), ReadOnly: d.cfg.readOnly, Now: d.cfg.now()}
	if !d.cfg.readOnly {
		p.CSRF = d.csrfToken(w, r, p.Base)
	}
	return p
}

// render writes page name, or a plain error if the template fails. The page is
// buffered (a failed template answers 500, not half a page), and bounded by what each
// page shows: previews (preview.go), a page of jobs, overviewGroups lines per table.
func (d *Dashboard) render(w http.ResponseWriter, status int, name string, p page) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	var buf bytes.Buffer
	if err := d.pages[name].Execute(&buf, p); err != nil {
		d.cfg.log.Warn("dashboard: rendering a page failed", "page", name, "err", err)
		http.Error(w, "dashboard: rendering the page failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// base is the prefix the request came in under: its path as sent, less the path the
// handler was given (http.StripPrefix keeps RequestURI as sent). "" at the root.
func base(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil || !strings.HasSuffix(u.Path, r.URL.Path) {
		return ""
	}
	return strings.TrimSuffix(strings.TrimSuffix(u.Path, r.URL.Path), "/")
}

// table finds a configured table, or a configured table's dead-letter table, by name.
func (d *Dashboard) table(name string) (Table, bool) {
	for _, ts := range [][]Table{d.tables, d.deadTables} {
		for _, t := range ts {
			if t.Name == name {
				return t, true
			}
		}
	}
	return Table{}, false
}

// subscription finds this process's subscription to queue of t, or nil.
func (d *Dashboard) subscription(t Table, queue string) *rowactor.Subscription {
	for _, s := range d.b.Subscriptions() {
		if s.Table().Name == t.Name && (t.Group == "" || s.Queue() == queue) {
			return s
		}
	}
	return nil
}

// deadLetterOf names the queue whose dead letters group holds, or "".
func (t Table) deadLetterOf(group string) string {
	for q, dl := range t.DeadLetters {
		if dl == group {
			return q
		}
	}
	return ""
}

// warnOnly keeps the default logger's records at warn and above: quiet by default.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}
