package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dashboard"
	"github.com/rowactor/rowactor/dialects"
)

var serveCommand = &command{
	name:    "serve",
	summary: "serve the operator's dashboard of queue tables over HTTP",
	help: `Usage: rowactor serve [-dsn URL] [-addr 127.0.0.1:8080] [-allow-host NAME,...] [-read-only]
                      [-dead-letters Q=D,...] [-dead-letter-table T=D,...] [-trace-url URL]
                      [column flags] TABLE...

Serves the dashboard (package dashboard) of each TABLE until SIGINT or SIGTERM, then
lets requests in flight finish (up to 10 s). Every TABLE is described by the same column
flags, as the other commands describe one.

The overview counts each group's rows (queued, due now, scheduled, in work, dead letters,
oldest due, most frequent errors), a line for every group that has rows, finished ones
included, and charts finished rows per minute by processed_at
(-processed-at): this process runs no subscription, so it has no live counts. The chart
needs an index leading with processed_at (schema renders none: without it each refresh
would read the whole table); without one the overview shows the CREATE INDEX statement
instead, and the chart within a minute of the index's creation. Job lists
filter by state, attempt and error text; a job page shows the payload, headers, attempt,
due time, lease, time of death, last error and trace id. Retry now, cancel and requeue of
dead letters are buttons, each a POST with a CSRF token; -read-only turns them off. Dead
letters are a group of the table (-dead-letters QUEUE=GROUP, with -group) or, for tables
without groups, a table of their own with the same columns (-dead-letter-table
TABLE=DEADTABLE): the overview counts its rows on TABLE's line and lists them, and
requeue moves them back. They read as dead, never as due, as do rows whose time of death
is set (-dead-at), with requeue as their action.

The dashboard has no login: it listens on 127.0.0.1 unless -addr says otherwise; put it
behind the authentication of your choice before listening elsewhere. Against DNS
rebinding it answers only requests whose Host is -addr's host, a localhost name or an
IP address (403 otherwise), and a POST only from its own origin; -allow-host adds the
names it is reached by (a proxy's, say), and -allow-host '*' answers any Host. A request
must arrive within 15 s, headers and body; idle connections close after a minute.

Examples:
  rowactor serve -dsn sqlite:jobs.db -group queue -attempt attempt -retry-after retry_after \
      -processed-at processed_at -locked-until locked_until -error error \
      -dead-letters emails=emails-dead email_jobs
  rowactor serve -dsn sqlite:jobs.db -attempt attempt -error error \
      -dead-letter-table invoices=invoices_dead invoices
  DATABASE_URL=postgres://app@db/app rowactor serve -addr :8080 -read-only -group queue jobs
`,
}

func init() { serveCommand.run = runServe }

// serveDrain bounds the wait for requests in flight once the command is told to stop.
const serveDrain = 10 * time.Second

// serveTimeouts bound what one connection may hold: a request's headers and its whole
// body (a dashboard's POST is a few hundred bytes: a client that stops sending frees its
// connection within read), a response's writing (a page renders in a few seconds at
// most: a count waits 2 s), and an idle keep-alive connection. Tests shorten read.
var serveTimeouts = struct{ readHeader, read, write, idle time.Duration }{
	readHeader: 5 * time.Second, read: 15 * time.Second, write: 2 * time.Minute, idle: time.Minute,
}

func runServe(ctx context.Context, e *env, args []string) error {
	fs := newFlags(serveCommand)
	dsnValue := dsnFlag(fs)
	addr := fs.String("addr", "127.0.0.1:8080", "the address to listen on (host:port; port 0 picks a free one)")
	readOnly := fs.Bool("read-only", false, "show no action and refuse every POST")
	traceURL := fs.String("trace-url", "", "link trace ids to a tracing UI: {trace_id} is replaced, e.g. http://jaeger:16686/trace/{trace_id}")
	var allowHosts []string
	fs.Func("allow-host", "a host name the dashboard answers besides -addr's, localhost names and IP addresses (comma-separated; repeatable; * answers any, for a proxy that checks hosts itself)", func(v string) error {
		return addAllowHosts(&allowHosts, v)
	})
	deadLetters := map[string]string{}
	fs.Func("dead-letters", "a queue and its dead-letter group, QUEUE=GROUP (comma-separated; repeatable; needs -group)", func(v string) error {
		return addDeadLetters(deadLetters, v)
	})
	deadTables := map[string]string{}
	fs.Func("dead-letter-table", "a table without groups and its dead-letter table, TABLE=DEADTABLE (comma-separated; repeatable)", func(v string) error {
		return addDeadLetterTables(deadTables, v)
	})
	var t rowactor.Table
	addTableFlags(fs, &t)
	rest, err := parse(e, serveCommand, fs, args)
	if err != nil {
		return err
	}
	tables, err := servedTables(t, rest, deadLetters, deadTables)
	if err != nil {
		return err
	}
	dsn, err := resolveDSN(e, *dsnValue)
	if err != nil {
		return err
	}
	b, closeDB, err := openBroker(ctx, dsn)
	if err != nil {
		return err
	}
	defer closeDB()
	if err := checkServedTables(ctx, b, tables); err != nil {
		return err
	}
	d, err := dashboard.New(b, tables, dashboardOptions(*addr, allowHosts, *readOnly, *traceURL)...)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "serving the dashboard of %s on http://%s/ (Ctrl-C stops)\n", strings.Join(rest, ", "), ln.Addr())
	return serveUntilStopped(ctx, e, d, ln)
}

// addAllowHosts parses one -allow-host value, a comma-separated list of host names, so
// that an empty name is refused with the value that holds it.
func addAllowHosts(allowHosts *[]string, v string) error {
	for _, h := range strings.Split(v, ",") {
		if h = strings.TrimSpace(h); h == "" {
			return fmt.Errorf("%q names no host", v)
		}
		*allowHosts = append(*allowHosts, h)
	}
	return nil
}

// addDeadLetters parses one -dead-letters value, comma-separated QUEUE=DEADGROUP pairs,
// refusing a pair without a dead-letter group or whose group is the queue itself.
func addDeadLetters(deadLetters map[string]string, v string) error {
	for _, pair := range strings.Split(v, ",") {
		q, dl, ok := strings.Cut(pair, "=")
		if !ok || dl == "" || q == dl {
			return fmt.Errorf("%q is not QUEUE=DEADGROUP", pair)
		}
		deadLetters[q] = dl
	}
	return nil
}

// addDeadLetterTables parses one -dead-letter-table value, comma-separated
// TABLE=DEADTABLE pairs, refusing a pair missing a side or naming one table twice.
func addDeadLetterTables(deadTables map[string]string, v string) error {
	for _, pair := range strings.Split(v, ",") {
		q, dl, ok := strings.Cut(pair, "=")
		if !ok || q == "" || dl == "" || q == dl {
			return fmt.Errorf("%q is not TABLE=DEADTABLE", pair)
		}
		deadTables[q] = dl
	}
	return nil
}

// servedTables describes each TABLE argument with the shared column flags and its dead
// letters, refusing flag combinations that cannot work before anything is opened.
func servedTables(t rowactor.Table, names []string, deadLetters, deadTables map[string]string) ([]dashboard.Table, error) {
	if len(names) == 0 {
		return nil, usagef("no TABLE given")
	}
	if len(deadLetters) > 0 && t.Group == "" {
		return nil, usagef("-dead-letters needs -group: dead-letter groups are groups of the table")
	}
	if len(deadTables) > 0 && t.Group != "" {
		return nil, usagef("-dead-letter-table is for tables without groups: with -group, name dead-letter groups with -dead-letters")
	}
	var tables []dashboard.Table
	for _, name := range names {
		tt := t
		if err := tableArg([]string{name}, &tt); err != nil {
			return nil, err
		}
		tables = append(tables, dashboard.Table{Table: tt, DeadLetters: deadLetters, DeadLetterTable: deadTables[name]})
	}
	for q := range deadTables {
		if !slices.Contains(names, q) {
			return nil, usagef("-dead-letter-table names %s, which is no TABLE given", q)
		}
	}
	return tables, nil
}

// checkServedTables checks each description against its live table now, as the other
// commands do, so a wrong column fails the command rather than every page.
func checkServedTables(ctx context.Context, b *rowactor.Broker, tables []dashboard.Table) error {
	a, ok := b.Dialect().(dialects.Admin)
	if !ok {
		return nil
	}
	for _, tt := range tables {
		if _, err := a.Stats(ctx, tt.Table, time.Now()); err != nil {
			return err
		}
		if tt.DeadLetterTable == "" {
			continue
		}
		// The dead-letter table's columns, as a requeue from it checks them.
		if _, err := a.Requeue(ctx, dialects.RequeueSpec{Table: tt.Table, FromTable: tt.DeadLetterTable, DryRun: true}, nil); err != nil {
			return fmt.Errorf("-dead-letter-table %s=%s: %w", tt.Name, tt.DeadLetterTable, err)
		}
	}
	return nil
}

// dashboardOptions turns the flags into the dashboard's options, keeping the host check
// against DNS rebinding on unless -allow-host '*' turns it off.
func dashboardOptions(addr string, allowHosts []string, readOnly bool, traceURL string) []dashboard.Option {
	opts := []dashboard.Option{dashboard.TraceURL(traceURL)}
	if !slices.Contains(allowHosts, "*") {
		// Against DNS rebinding: a page of another site whose name points at this
		// address would otherwise read the dashboard, token and all, as its own.
		if host, _, err := net.SplitHostPort(addr); err == nil && host != "" {
			allowHosts = append(allowHosts, host)
		}
		opts = append(opts, dashboard.AllowHosts(allowHosts...))
	}
	if readOnly {
		opts = append(opts, dashboard.ReadOnly())
	}
	return opts
}

// serveUntilStopped serves h on ln until ctx ends, then lets requests in flight finish
// for up to serveDrain, so a stop does not cut a page or an action in half.
func serveUntilStopped(ctx context.Context, e *env, h http.Handler, ln net.Listener) error {
	// Requests do not inherit ctx: a stop lets those in flight finish (Shutdown).
	srv := &http.Server{Handler: h, ReadHeaderTimeout: serveTimeouts.readHeader, ReadTimeout: serveTimeouts.read,
		WriteTimeout: serveTimeouts.write, IdleTimeout: serveTimeouts.idle}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), serveDrain)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	fmt.Fprintln(e.stdout, "stopped")
	return err
}
