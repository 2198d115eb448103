package main

// -mode latency: how long a row waits from its publish to its handler's start, when the
// subscription is idle (one publish at a time) and under a steady trickle. The subscription
// keeps every rowactor default (one worker, the 1 s poll, the 30 s lease): what a user who
// does not tune gets. A publish wakes the subscription; a delivery that waited a whole poll
// interval means the wake was lost.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

// defaultPoll is rowactor's default PollInterval (defaultSubscribeConfig in options.go).
// A row whose wake was lost is found by the next poll, up to this late: a delivery that
// waited at least this long most likely waited for a poll.
const defaultPoll = time.Second

// latencyWarmup publishes go first, unmeasured, so the first measured row does not pay
// for preparing statements and opening connections.
const latencyWarmup = 3

// publisherFlag, as the first argument, makes the binary a bare publisher (publisherMain).
const publisherFlag = "-latency-publisher"

type latencyLine struct {
	Mode      string `json:"mode"`
	DB        string `json:"db"`
	Form      string `json:"form"`
	Load      string `json:"load"`      // idle, steady
	Publisher string `json:"publisher"` // in-process, other-process
	// Workers is the subscription's worker count: rowactor's default.
	Workers int     `json:"workers"`
	N       int     `json:"n"`
	P50     float64 `json:"p50_ms"`
	P90     float64 `json:"p90_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
	// WaitedPoll counts deliveries that took at least PollMS (rowactor's default poll).
	WaitedPoll int `json:"waited_poll"`
	PollMS     int `json:"poll_ms"`
	// PublishP50 is the idle load's median time inside Publish (the INSERT and its
	// commit): the part of the latency before the row could be claimed at all.
	PublishP50 float64 `json:"publish_p50_ms,omitempty"`
	// PublishedPerS is the steady load's achieved publish rate (below the asked rate when
	// a publish took longer than the gap between two).
	PublishedPerS float64 `json:"published_per_s,omitempty"`
}

// runLatency measures every form of one database: in-process, and on PostgreSQL also
// with the publisher in another process, whose wake can only come through the database
// (LISTEN/NOTIFY).
func runLatency(ctx context.Context, cfg config, tg *target, out *json.Encoder) error {
	publishers := []string{"in-process"}
	if tg.db == "postgres" {
		publishers = append(publishers, "other-process")
	}
	for _, form := range cfg.forms {
		for _, who := range publishers {
			lines, err := latencyOnce(ctx, cfg, tg, form, who)
			if err != nil {
				return fmt.Errorf("latency %s %s, publisher %s: %w", tg.db, form, who, err)
			}
			for _, l := range lines {
				pub := fmt.Sprintf("publish p50 %.2f ms", l.PublishP50)
				if l.Load == "steady" {
					pub = fmt.Sprintf("%.1f published/s", l.PublishedPerS)
				}
				fmt.Fprintf(os.Stderr, "bench: latency %s %s %-6s %-13s n=%d p50 %.2f p90 %.2f p99 %.2f max %.2f ms, %d waited a poll (%s; load %s)\n",
					l.DB, l.Form, l.Load, l.Publisher, l.N, l.P50, l.P90, l.P99, l.Max, l.WaitedPoll, pub, loadavg())
				if err := out.Encode(l); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// latencyOnce subscribes to a fresh, empty table, runs the idle load and then the
// steady one through one publisher, and drops the table.
func latencyOnce(ctx context.Context, cfg config, tg *target, form dialects.Form, who string) ([]latencyLine, error) {
	t := tableFor(form)
	if err := tg.refill(ctx, t.Table, 0); err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	defer tg.drop(ctx, t.Name)
	steadyN := cfg.latencyRate * cfg.latencySeconds
	rec := &stamped{settled: make(chan struct{}, latencyWarmup+cfg.latencyN+steadyN)}
	b, err := rowactor.New(tg.d, rowactor.WithOnSettled(rec.settle))
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := b.Shutdown(sctx); err != nil {
			fmt.Fprintln(os.Stderr, "bench: latency: shutdown:", err)
		}
	}()
	if _, err := b.Subscribe(ctx, t.Table, "bench", rec.handle); err != nil { // rowactor's defaults
		return nil, err
	}
	var pub latencyPublisher = &localPublisher{b: b, t: t.Table, n: steadyN, rate: cfg.latencyRate}
	if who == "other-process" {
		if pub, err = startPublisher(ctx, cfg, t, steadyN); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err := pub.close(); err != nil {
			fmt.Fprintln(os.Stderr, "bench: latency: publisher:", err)
		}
	}()

	// Idle: one publish, wait until it settled, pause (less than a poll, so a lost wake
	// shows as a wait of up to a poll, never hidden by a poll that came anyway), repeat.
	var publishing []time.Duration
	for i := range latencyWarmup + cfg.latencyN {
		if i == latencyWarmup {
			rec.take() // the warm-up's
		}
		took, err := pub.one(ctx)
		if err != nil {
			return nil, err
		}
		if i >= latencyWarmup {
			publishing = append(publishing, took)
		}
		if err := rec.wait(ctx, 1, 10*time.Second); err != nil {
			return nil, err
		}
		time.Sleep(cfg.latencyGap)
	}
	idle := rec.take()

	// Steady: rate publishes a second; the lone worker keeps up while a delivery takes
	// less than the gap between two publishes.
	took, err := pub.steady(ctx)
	if err != nil {
		return nil, err
	}
	if err := rec.wait(ctx, steadyN, time.Duration(cfg.latencySeconds)*time.Second+time.Minute); err != nil {
		return nil, err
	}
	steady := rec.take()
	if err := rec.failure(); err != nil {
		return nil, err
	}
	lines := []latencyLine{
		latencyOf(tg.db, form, "idle", who, idle),
		latencyOf(tg.db, form, "steady", who, steady),
	}
	slices.Sort(publishing)
	lines[0].PublishP50 = ms(percentile(publishing, 50))
	lines[1].PublishedPerS = roundTo(float64(steadyN)/took.Seconds(), 1)
	return lines, nil
}

func latencyOf(db string, form dialects.Form, load, who string, ds []time.Duration) latencyLine {
	slices.Sort(ds)
	waited := len(ds) - sortFind(ds, defaultPoll)
	return latencyLine{
		Mode: "latency", DB: db, Form: form.String(), Load: load, Publisher: who, Workers: 1, N: len(ds),
		P50: ms(percentile(ds, 50)), P90: ms(percentile(ds, 90)), P99: ms(percentile(ds, 99)), Max: ms(percentile(ds, 100)),
		WaitedPoll: waited, PollMS: int(defaultPoll.Milliseconds()),
	}
}

// sortFind is the index of the first of sorted ds at least d.
func sortFind(ds []time.Duration, d time.Duration) int {
	i, _ := slices.BinarySearch(ds, d)
	return i
}

// percentile is the nearest-rank p-th percentile of sorted ds (p=100 is the maximum).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(ds))*p/100)) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func ms(d time.Duration) float64 { return roundTo(float64(d)/float64(time.Millisecond), 2) }

// stamp is a payload: the publisher's wall clock in Unix nanoseconds, read just before
// Publish. The wall clock, not the monotonic one, so that another process on this machine
// stamps on the same clock as the handler reads.
func stamp() []byte { return strconv.AppendInt(nil, time.Now().UnixNano(), 10) }

// stamped collects what the handlers measured and counts the settlements.
type stamped struct {
	mu      sync.Mutex
	took    []time.Duration
	err     error
	settled chan struct{} // one per settlement; sized for the whole run, so never full
}

// handle reads the clock first, then the payload's stamp, and acks.
func (s *stamped) handle(_ context.Context, d *rowactor.Delivery) rowactor.Outcome {
	start := time.Now()
	ns, err := strconv.ParseInt(string(d.Payload()), 10, 64)
	s.mu.Lock()
	if err != nil {
		s.err = errors.Join(s.err, fmt.Errorf("row %d: payload %q is no stamp", d.ID(), d.Payload()))
	} else {
		s.took = append(s.took, start.Sub(time.Unix(0, ns)))
	}
	s.mu.Unlock()
	return rowactor.Ack()
}

// settle is the WithOnSettled hook; it must not block.
func (s *stamped) settle(st rowactor.Settlement) {
	if st.Released && st.Err == nil {
		return // given back unstarted (every worker stalled): delivered again
	}
	if st.Err != nil || st.Step != "ack" {
		s.mu.Lock()
		s.err = errors.Join(s.err, fmt.Errorf("row %d: step %s: %v", st.ID, st.Step, st.Err))
		s.mu.Unlock()
	}
	select {
	case s.settled <- struct{}{}:
	default:
	}
}

// wait waits for n more settlements, at most limit.
func (s *stamped) wait(ctx context.Context, n int, limit time.Duration) error {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for i := range n {
		select {
		case <-s.settled:
		case <-timer.C:
			return fmt.Errorf("%d of %d deliveries not settled after %v", n-i, n, limit)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// take returns the measurements so far and forgets them.
func (s *stamped) take() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	ds := s.took
	s.took = nil
	return ds
}

func (s *stamped) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// A latencyPublisher publishes stamped rows: one, or the steady load (n rows at rate a
// second), returning how long the steady load took to publish.
type latencyPublisher interface {
	one(ctx context.Context) (time.Duration, error)
	steady(ctx context.Context) (time.Duration, error)
	close() error
}

// localPublisher publishes through the subscription's own broker, which wakes the
// subscription in process.
type localPublisher struct {
	b       *rowactor.Broker
	t       rowactor.Table
	n, rate int
}

func (p *localPublisher) one(ctx context.Context) (time.Duration, error) {
	return publishSteady(ctx, p.b, p.t, 1, p.rate)
}

func (p *localPublisher) steady(ctx context.Context) (time.Duration, error) {
	return publishSteady(ctx, p.b, p.t, p.n, p.rate)
}

func (p *localPublisher) close() error { return nil }

// publishSteady publishes n stamped rows, the i-th due i/rate seconds after the first; a
// publisher running late publishes at once, so it catches up rather than drifting.
func publishSteady(ctx context.Context, b *rowactor.Broker, t rowactor.Table, n, rate int) (time.Duration, error) {
	gap := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d)
		}
		if _, err := b.Publish(ctx, t, "bench", stamp()); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// processPublisher drives a publisher in another process (publisherMain) over its stdin
// and stdout: a line "one" or "steady" asks for a publish, "ok <seconds>" answers.
type processPublisher struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startPublisher starts this binary again as a publisher to t, and waits until it is
// ready (its broker open), so that its start-up is not timed.
func startPublisher(ctx context.Context, cfg config, t tableDesc, steadyN int) (*processPublisher, error) {
	self, err := os.Executable() // os.Args[0], resolved: go run's binary sits in a temporary directory
	if err != nil {
		self = os.Args[0]
	}
	cmd := exec.CommandContext(ctx, self, publisherFlag, "-pg", cfg.pgURL, "-table", t.Name, "-form", t.Form().String(),
		"-n", strconv.Itoa(steadyN), "-rate", strconv.Itoa(cfg.latencyRate))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &processPublisher{cmd: cmd, in: in, out: bufio.NewReader(out)}
	if line, err := p.out.ReadString('\n'); err != nil || line != "ready\n" {
		return nil, errors.Join(fmt.Errorf("the publisher process did not start (%q, %v)", line, err), p.close())
	}
	return p, nil
}

func (p *processPublisher) ask(cmd string) (time.Duration, error) {
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		return 0, fmt.Errorf("publisher process: %w", err)
	}
	line, err := p.out.ReadString('\n')
	secs, ok := strings.CutPrefix(strings.TrimSpace(line), "ok ")
	f, perr := strconv.ParseFloat(secs, 64)
	if err != nil || !ok || perr != nil {
		return 0, fmt.Errorf("publisher process answered %q to %s (%v); its stderr is above", line, cmd, err)
	}
	return time.Duration(f * float64(time.Second)), nil
}

func (p *processPublisher) one(context.Context) (time.Duration, error)    { return p.ask("one") }
func (p *processPublisher) steady(context.Context) (time.Duration, error) { return p.ask("steady") }

// close ends the publisher's input, on which it shuts its broker down and exits.
func (p *processPublisher) close() error {
	p.in.Close()
	return p.cmd.Wait()
}

// publisherMain is the other process of a latency run: a broker on the PostgreSQL URL,
// opened with rowactor.Open's defaults as a publishing service's would be, that publishes
// stamped rows into the table when asked on stdin and answers on stdout.
func publisherMain(args []string) error {
	fs := flag.NewFlagSet("bench "+publisherFlag, flag.ContinueOnError)
	url := fs.String("pg", "", "PostgreSQL URL")
	table := fs.String("table", "", "the table to publish into")
	form := fs.String("form", "lease", "its claim form (rowlock, lease, advisory)")
	n := fs.Int("n", 500, "rows of the steady load")
	rate := fs.Int("rate", 100, "publishes per second of the steady load")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, ok := formNames[*form]
	if !ok || *url == "" || *table == "" || *n < 1 || *rate < 1 {
		return fmt.Errorf("want -pg, -table, -form, -n and -rate (got %q)", args)
	}
	ctx := context.Background()
	b, err := rowactor.Open(ctx, *url)
	if err != nil {
		return err
	}
	defer b.Shutdown(ctx)
	t := tableNamed(f, *table).Table
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var took time.Duration
		switch in.Text() {
		case "one":
			took, err = publishSteady(ctx, b, t, 1, *rate)
		case "steady":
			took, err = publishSteady(ctx, b, t, *n, *rate)
		default:
			err = fmt.Errorf("unknown request %q", in.Text())
		}
		if err != nil {
			return err
		}
		fmt.Printf("ok %.6f\n", took.Seconds())
	}
	return in.Err()
}
