package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// consumerEnv carries a consumer process's assignment from the parent: the binary re-runs
// itself with it set.
const consumerEnv = "ROWACTOR_CHAOS_CONSUMER"

// subSpec is one subscription of a consumer.
type subSpec struct {
	Table         rowactor.Table
	Queue         string
	Workers       int
	Lease         time.Duration // 0 outside the lease form
	MaxAttempts   int           // with DeadGroup: poison rows end dead-lettered
	DeadGroup     string
	Transactional bool
	KeyPanic      bool // WorkersByKey, with a key function that panics on keypanic rows
}

type consumerSpec struct {
	N       int    // the consumer's number in its scenario (1, 2, ...)
	DB      string // sqlite, postgres, mysql
	URL     string
	PoolMax int // > 0: a pool of this size (MySQL: rowactor.New(mysql.New(db)); SQLite: DB().SetMaxOpenConns)
	Subs    []subSpec
	Out     string
	Poll    time.Duration
	Work    time.Duration // a plain row's handler sleeps up to this
	Slow    time.Duration // a "slow" row's handler sleeps this (plus up to 10%)
	// Deadlock fault: the transactional handler's side tables.
	Hot, SideLog string
	// Stuck fault: a stuck row's handler ignores its context and runs StuckFor; SIGUSR2
	// shuts down with a context of ShutdownWithin.
	StuckFor, ShutdownWithin time.Duration
}

// Payload kinds: the parent marks rows by their payload, "chaos-<n>" plus a suffix.
const (
	kindPlain  = ""
	kindSlow   = "slow"   // the handler runs Slow, longer than the lease
	kindPoison = "poison" // the handler always fails: Fail(errPoison)
	kindHot    = "hot"    // the transactional handler locks the two hot rows, in an order by id parity
	kindStuck  = "stuck"  // the handler ignores its context and runs StuckFor
	// The key function of a WorkersByKey subscription panics on the row: its handler must
	// never run, and the row stays queued.
	kindKeyPanic = "keypanic"
)

func payloadKind(p []byte) string {
	s := string(p)
	if i := strings.LastIndexByte(s, '-'); i >= 0 {
		switch k := s[i+1:]; k {
		case kindSlow, kindPoison, kindHot, kindStuck, kindKeyPanic:
			return k
		}
	}
	return kindPlain
}

// deadlocked remembers the hot rows whose second lock failed in this process: they lock in
// one order from then on (MySQL's row lock form spends no attempt when a deadlock rolls
// the claim back).
var deadlocked idSet

type idSet struct {
	mu sync.Mutex
	m  map[int64]bool
}

func (s *idSet) add(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[int64]bool{}
	}
	s.m[id] = true
}

func (s *idSet) has(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}

// sideWritesPerRow is how many rows a transactional handler inserts into the side log per
// delivery (the deadlock fault's all-or-nothing check counts them).
const sideWritesPerRow = 2

// The consumer's file has one line per event, each written with a single write(2) as it
// happens, so a SIGKILL loses at most what had not been written yet (the parent also
// tolerates a truncated last line). <ns> is the wall clock in Unix nanoseconds (one host):
//
//	r <ns>                                                       subscribed, ready
//	d <seq> <sub> <id> <attempt> <ns>                            a handler started
//	h <seq> <ns> <outcome> <error or ->                          that handler returned
//	S <sub> <id> <attempt> <ns> <step> <released> <class> <err>  WithOnSettled: a settlement
//	q <ns> <term|cancelled|bounded> stuck=<n>                    Shutdown called (n: stuck handlers in work)
//	x <ns> drained=<b> released=<n> connections_closed=<n> err=<e> drain=<e>  Shutdown returned
//	s <message>                                                  a start-up retry
//	p <ns> <ns>                                                  the process did not run (a late heartbeat)
//
// <seq> numbers the process's deliveries; <sub> is the subscription's index in the spec.
// <class> of a settlement is ok (Err == nil), leaselost (ErrLeaseLost), closed
// (ErrClosed) or error. Shutdown's error is split: drain= is its report of a drain the
// context cut short (rowactor.ErrNotDrained, expected under a cancelled context and told
// by drained= too), err= anything else it returned (<nil> when nothing), which alone makes
// the consumer exit 1.
type lineWriter struct {
	mu sync.Mutex
	f  *os.File
}

func (w *lineWriter) printf(format string, args ...any) {
	// An error text may span lines (errors.Join): keep one event per line.
	line := strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " | ") + "\n"
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.f.WriteString(line)
}

func now() int64 { return time.Now().UnixNano() }

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " | ")
	if s == "" {
		return "-"
	}
	return s
}

// runConsumer is a consumer process: it subscribes and handles rows until the parent sends
// SIGTERM (Shutdown with a 15 s context), SIGUSR1 (Shutdown with a context cancelled
// beforehand) or SIGUSR2 (Shutdown with a context of ShutdownWithin). After Shutdown it writes its report, prints "x" on stdout, and waits for
// its stdin to close before it exits, so the parent can look for what it left behind
// while the process still lives.
func runConsumer(specText string) int {
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2, os.Interrupt)
	var spec consumerSpec
	if err := json.Unmarshal([]byte(specText), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 2
	}
	f, err := os.OpenFile(spec.Out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 2
	}
	defer f.Close()
	w := &lineWriter{f: f}

	// The parent holds our stdin: EOF means it is done with us (or died).
	stdinEOF := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinEOF)
	}()

	// A heartbeat notes when this process did not run for a while (CPU starvation on a
	// loaded machine, a long GC pause): check (e) does not blame idle workers then.
	go func() {
		const beat = 50 * time.Millisecond
		last := time.Now()
		for {
			time.Sleep(beat)
			t := time.Now()
			if t.Sub(last) > 6*beat {
				w.printf("p %d %d", last.Add(beat).UnixNano(), t.UnixNano())
			}
			last = t
		}
	}()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	subIndex := map[string]int{}
	for i, s := range spec.Subs {
		subIndex[s.Table.Name] = i
	}
	onSettled := func(s rowactor.Settlement) {
		class, text := "ok", "-"
		switch {
		case s.Err == nil:
		case errors.Is(s.Err, rowactor.ErrLeaseLost):
			class, text = "leaselost", oneLine(s.Err.Error())
		case errors.Is(s.Err, rowactor.ErrClosed):
			class, text = "closed", oneLine(s.Err.Error())
		default:
			class, text = "error", oneLine(s.Err.Error())
		}
		w.printf("S %d %d %d %d %s %v %s %s", subIndex[s.Table], s.ID, s.Attempt, now(), s.Step, s.Released, class, text)
	}

	var seq, stuckInWork atomic.Int64
	errPoison := errors.New("chaos: a poison row fails at every attempt")
	handler := func(sub int, ss subSpec) rowactor.Handler {
		return func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
			n := seq.Add(1)
			w.printf("d %d %d %d %d %d", n, sub, d.ID(), d.Attempt(), now())
			kind := payloadKind(d.Payload())
			out := rowactor.Ack()
			var herr error
			switch kind {
			case kindPoison:
				sleepCtx(ctx, rand.N(spec.Work+1))
				out = rowactor.Fail(errPoison)
			case kindSlow:
				sleepCtx(ctx, spec.Slow+rand.N(spec.Slow/10+1))
			case kindStuck:
				// A handler that ignores its context: Shutdown must not wait for it.
				stuckInWork.Add(1)
				time.Sleep(spec.StuckFor)
				stuckInWork.Add(-1)
			default:
				sleepCtx(ctx, rand.N(spec.Work+1))
			}
			if ss.Transactional && spec.SideLog != "" && kind != kindPoison {
				if herr = sideWrites(ctx, spec, d, kind == kindHot); herr != nil {
					// A statement failed (a deadlock, say): the transaction is spoiled;
					// return the error rather than go on (see dialects/mysql).
					out = rowactor.Retry()
				}
			}
			text := "-"
			if herr != nil {
				text = oneLine(herr.Error())
			}
			w.printf("h %d %d %s %s", n, now(), out.String(), text)
			return out
		}
	}

	// The parent may kill this process's sessions while it starts: retry Open and
	// Subscribe (the parent counts a consumer that gives up as an unexpected exit).
	ctx := context.Background()
	var (
		b      *rowactor.Broker
		closer func() error
	)
	for try := 1; ; try++ {
		b, closer, err = openBroker(ctx, spec, log, onSettled)
		if err == nil {
			for i, s := range spec.Subs {
				opts := []rowactor.SubscribeOption{rowactor.Workers(s.Workers), rowactor.PollInterval(spec.Poll)}
				if s.KeyPanic {
					opts[0] = rowactor.WorkersByKey(s.Workers, func(d *rowactor.Delivery) string {
						if payloadKind(d.Payload()) == kindKeyPanic {
							panic(fmt.Sprintf("chaos: the key function panics on row %d", d.ID()))
						}
						return strconv.FormatInt(d.ID()%16, 10)
					})
				}
				if s.Lease > 0 {
					opts = append(opts, rowactor.Lease(s.Lease))
				}
				if s.MaxAttempts > 0 {
					opts = append(opts, rowactor.MaxAttempts(s.MaxAttempts), rowactor.DeadLetterGroup(s.DeadGroup))
				}
				if s.Transactional {
					opts = append(opts, rowactor.Transactional())
				}
				if _, err = b.Subscribe(ctx, s.Table, s.Queue, handler(i, s), opts...); err != nil {
					break
				}
			}
			if err == nil {
				break
			}
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = b.Shutdown(sctx)
			cancel()
			if closer != nil {
				_ = closer()
			}
		}
		w.printf("s start-up try %d: %v", try, err)
		if try == 20 {
			fmt.Fprintln(os.Stderr, "consumer: giving up:", err)
			return 2
		}
		select {
		case <-stdinEOF:
			return 3
		case <-time.After(100 * time.Millisecond):
		}
	}
	w.printf("r %d", now())
	fmt.Println("r")

	var sig os.Signal
	select {
	case sig = <-stop:
	case <-stdinEOF:
		return 3 // the parent is gone
	}
	var (
		sctx   context.Context
		cancel context.CancelFunc
	)
	kind := "term"
	switch sig {
	case syscall.SIGUSR1:
		kind = "cancelled"
		sctx, cancel = context.WithCancel(ctx)
		cancel() // already cancelled when Shutdown is called
	case syscall.SIGUSR2:
		kind = "bounded"
		sctx, cancel = context.WithTimeout(ctx, spec.ShutdownWithin)
	default:
		sctx, cancel = context.WithTimeout(ctx, 15*time.Second)
	}
	defer cancel()
	w.printf("q %d %s stuck=%d", now(), kind, stuckInWork.Load())
	rep, serr := b.Shutdown(sctx)
	cut, err := splitNotDrained(serr)
	if closer != nil {
		// A pool the consumer made itself (rowactor.New): the broker does not own it.
		if cerr := closer(); cerr != nil && err == nil {
			err = fmt.Errorf("close the pool: %w", cerr)
		}
	}
	drain := "-"
	if cut != nil {
		drain = oneLine(cut.Error())
	}
	w.printf("x %d drained=%v released=%d connections_closed=%d err=%s drain=%s", now(), rep.Drained, rep.Released, rep.ConnectionsClosed, errText(err), drain)
	fmt.Println("x")
	<-stdinEOF
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer: shutdown:", err)
		return 1
	}
	return 0
}

// splitNotDrained separates Shutdown's report of a drain its context cut short from any
// other error Shutdown returned (errors.Join'd beside it).
func splitNotDrained(err error) (notDrained, other error) {
	if err == nil {
		return nil, nil
	}
	parts := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	}
	var rest []error
	for _, e := range parts {
		if notDrained == nil && errors.Is(e, rowactor.ErrNotDrained) {
			notDrained = e
			continue
		}
		rest = append(rest, e)
	}
	return notDrained, errors.Join(rest...)
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return oneLine(err.Error())
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// openBroker opens the consumer's broker: rowactor.Open on the URL, except where the spec
// asks for a small pool that Open cannot size (MySQL: the consumer opens the pool and
// hands it to rowactor.New; closer closes it after Shutdown).
func openBroker(ctx context.Context, spec consumerSpec, log *slog.Logger, onSettled func(rowactor.Settlement)) (*rowactor.Broker, func() error, error) {
	opts := []rowactor.Option{rowactor.WithLogger(log), rowactor.WithOnSettled(onSettled)}
	if spec.PoolMax > 0 && spec.DB == "mysql" {
		cfg, err := mysqldrv.ParseDSN(strings.TrimPrefix(spec.URL, "mysql://"))
		if err != nil {
			return nil, nil, err
		}
		cfg.ParseTime = true
		conn, err := mysqldrv.NewConnector(cfg)
		if err != nil {
			return nil, nil, err
		}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(spec.PoolMax)
		db.SetMaxIdleConns(spec.PoolMax)
		b, err := rowactor.New(mysql.New(db), opts...)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return b, db.Close, nil
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := rowactor.Open(octx, spec.URL, opts...)
	if err != nil {
		return nil, nil, err
	}
	if spec.PoolMax > 0 {
		if d, ok := b.Dialect().(*sqlite.Dialect); ok {
			d.DB().SetMaxOpenConns(spec.PoolMax)
		}
	}
	return b, nil, nil
}

// sideWrites is the deadlock fault's transactional handler body, on the delivery's
// transaction: a hot row locks both hot counters, on its first attempt in an order by the
// id's parity (so two hot rows in work deadlock), with a pause between; every row then inserts
// sideWritesPerRow rows into the side log. Ack commits all of it with the settlement;
// Retry rolls it back.
func sideWrites(ctx context.Context, spec consumerSpec, d *rowactor.Delivery, hot bool) error {
	// Through the delivery's *sql.Tx on every database: on PostgreSQL that is rowactor's
	// own driver over the lent pgx.Tx, which the deadlocks and kills then exercise.
	postgres := d.Broker().Dialect().Name() == "postgres"
	exec := func(query string, args ...any) error {
		tx := d.Tx()
		if tx == nil {
			return errors.New("no transaction to write in")
		}
		if !postgres {
			query = strings.NewReplacer("$1", "?", "$2", "?", "$3", "?").Replace(query)
		}
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}
	if hot {
		// The first attempt locks in an order by the id's parity; a retry (or a row that
		// deadlocked here before) locks in one order, so the rows converge instead of
		// deadlocking each other forever (the side session still locks in the other order).
		a, b := 1, 2
		if d.ID()%2 == 1 && d.Attempt() <= 1 && !deadlocked.has(d.ID()) {
			a, b = 2, 1
		}
		if err := exec("UPDATE "+spec.Hot+" SET v = v + 1 WHERE k = $1", a); err != nil {
			return err
		}
		sleepCtx(ctx, 2*time.Millisecond+rand.N(3*time.Millisecond))
		if err := exec("UPDATE "+spec.Hot+" SET v = v + 1 WHERE k = $1", b); err != nil {
			deadlocked.add(d.ID())
			return err
		}
	}
	for n := 1; n <= sideWritesPerRow; n++ {
		if err := exec("INSERT INTO "+spec.SideLog+" (row_id, n, consumer) VALUES ($1, $2, $3)", d.ID(), n, spec.N); err != nil {
			return err
		}
	}
	return nil
}

// readMarkers reads a consumer's stdout: it closes ready at the "r" line (subscribed,
// signals handled) and x at the "x" line (Shutdown returned).
func readMarkers(r io.Reader, ready, x chan struct{}) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		switch sc.Text() {
		case "r":
			close(ready)
		case "x":
			close(x)
			return
		}
	}
}
