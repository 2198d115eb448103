package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
)

// A Galera cluster (scripts/galera.sh): three MariaDB nodes, each a server of its own with
// its own sessions. Consumer n works on node (n-1)%3+1, batches are published through
// every node in turn, and the parent reads and creates tables through node 1, which the
// nodekill fault never kills. Row locks and GET_LOCK are node-local on a cluster, so only
// the lease form runs (rowactor refuses the others there).

// galeraNodes are the nodes' DSNs: $ROWACTOR_GALERA_DSNS (comma-separated), else
// scripts/galera.sh's ports 3307-3309.
func galeraNodes(dsn string) []string {
	list := dsn
	if list == "" {
		list = os.Getenv("ROWACTOR_GALERA_DSNS")
	}
	if list == "" {
		list = "root@tcp(127.0.0.1:3307)/test,root@tcp(127.0.0.1:3308)/test,root@tcp(127.0.0.1:3309)/test"
	}
	var out []string
	for _, d := range strings.Split(list, ",") {
		if d = strings.TrimSpace(d); d != "" {
			if !strings.HasPrefix(d, "mysql://") {
				d = "mysql://" + d
			}
			out = append(out, d)
		}
	}
	return out
}

// galeraBackend is a myBackend per node.
type galeraBackend struct {
	nodes   []*myBackend
	brokers []*rowactor.Broker // publishing brokers, one per node; brokers[0] is the parent's
	own     []*rowactor.Broker // those opened here (nodes 2..n), shut down by close

	mu   []sync.RWMutex // per node: a publish holds it shared, taking a node down exclusively
	down []bool         // under mu
	next int            // the node of the next publish (the publisher is one goroutine)
}

func newGaleraBackend(ctx context.Context, urls []string, b *rowactor.Broker) (*galeraBackend, error) {
	if len(urls) < 2 {
		return nil, fmt.Errorf("galera: %d node DSNs, want one per node (ROWACTOR_GALERA_DSNS)", len(urls))
	}
	g := &galeraBackend{mu: make([]sync.RWMutex, len(urls)), down: make([]bool, len(urls))}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i, u := range urls {
		nb := b
		if i > 0 {
			octx, cancel := context.WithTimeout(ctx, 30*time.Second)
			var err error
			nb, err = rowactor.Open(octx, u, rowactor.WithPollOnly(), rowactor.WithLogger(log))
			cancel()
			if err != nil {
				g.close()
				return nil, fmt.Errorf("galera node %d: %w", i+1, err)
			}
			g.own = append(g.own, nb)
		}
		d, ok := nb.Dialect().(*mysql.Dialect)
		if !ok {
			g.close()
			return nil, fmt.Errorf("galera node %d: dialect %T, want MySQL's", i+1, nb.Dialect())
		}
		var name, wsrep string
		if err := d.DB().QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&name, &wsrep); err != nil || wsrep != "ON" {
			g.close()
			return nil, fmt.Errorf("galera node %d (%s) is not a cluster node (wsrep_on %q, %v): start one with bash scripts/galera.sh start", i+1, u, wsrep, err)
		}
		var dbName string
		if err := d.DB().QueryRowContext(ctx, "SELECT DATABASE()").Scan(&dbName); err != nil {
			g.close()
			return nil, err
		}
		g.nodes = append(g.nodes, &myBackend{db: d.DB(), url: u, dbName: dbName})
		g.brokers = append(g.brokers, nb)
	}
	return g, nil
}

func (g *galeraBackend) close() {
	for _, b := range g.own {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = b.Shutdown(sctx)
		cancel()
	}
}

// nodeOf is consumer n's node (0-based).
func (g *galeraBackend) nodeOf(n int) int { return (n - 1) % len(g.nodes) }

func (g *galeraBackend) consumerURL(n, _ int, _ ...string) string { return g.nodes[g.nodeOf(n)].url }
func (g *galeraBackend) canKillSessions() bool                    { return true }
func (g *galeraBackend) quote(name string) string                 { return g.nodes[0].quote(name) }
func (g *galeraBackend) exec(ctx context.Context, stmt string) error {
	return g.nodes[0].exec(ctx, stmt)
}
func (g *galeraBackend) count(ctx context.Context, t rowactor.Table, group string) (int, error) {
	return g.nodes[0].count(ctx, t, group)
}
func (g *galeraBackend) left(ctx context.Context, t rowactor.Table) ([]leftRow, error) {
	return g.nodes[0].left(ctx, t)
}

// publish sends the batch through the next node that is up, in one transaction there.
func (g *galeraBackend) publish(ctx context.Context, _ *rowactor.Broker, t rowactor.Table, queue string, payloads [][]byte) ([]int64, error) {
	for range g.nodes {
		i := g.next
		g.next = (g.next + 1) % len(g.nodes)
		g.mu[i].RLock()
		if g.down[i] {
			g.mu[i].RUnlock()
			continue
		}
		// A cluster may abort any transaction with 1213 (a conflict found at certification,
		// or a replicated write that needed its locks): it was rolled back, so the batch
		// is sent again. The service publishing is told the same.
		var (
			ids []int64
			err error
		)
		for try := 0; try < 10; try++ {
			if ids, err = g.nodes[i].publish(ctx, g.brokers[i], t, queue, payloads); err == nil || !mysql.IsRetryable(err) {
				break
			}
			sleepCtx(ctx, time.Duration(try+1)*10*time.Millisecond)
		}
		g.mu[i].RUnlock()
		return ids, err
	}
	return nil, errors.New("galera: every node is down")
}

// setDown marks node i down (waiting for its publishes in flight) or up.
func (g *galeraBackend) setDown(i int, down bool) {
	g.mu[i].Lock()
	g.down[i] = down
	g.mu[i].Unlock()
}

// Sessions of node i carry i in their id's top bits, so kill finds their node.
const nodeShift = 48

func (g *galeraBackend) sessions(ctx context.Context, pids map[int]int) ([]session, error) {
	var out []session
	for i, n := range g.nodes {
		g.mu[i].RLock()
		down := g.down[i]
		g.mu[i].RUnlock()
		if down {
			continue
		}
		ss, err := n.sessions(ctx, pids)
		if err != nil {
			return nil, fmt.Errorf("node %d: %w", i+1, err)
		}
		for _, s := range ss {
			s.id |= int64(i) << nodeShift
			out = append(out, s)
		}
	}
	return out, nil
}

func (g *galeraBackend) kill(ctx context.Context, ss []session) (int, error) {
	killed := 0
	for _, s := range ss {
		i := int(s.id >> nodeShift)
		s.id &= 1<<nodeShift - 1
		n, err := g.nodes[i].kill(ctx, []session{s})
		killed += n
		if err != nil {
			return killed, err
		}
	}
	return killed, nil
}

func (g *galeraBackend) keysHeld(context.Context, rowactor.Table, []int64) ([]int64, error) {
	return nil, nil // no advisory form on a cluster
}
func (g *galeraBackend) writeLocked(context.Context) (bool, error) { return false, nil }
func (g *galeraBackend) hold(ctx context.Context, t rowactor.Table, ids []int64, max int, d time.Duration) ([]int64, error) {
	return g.nodes[0].hold(ctx, t, ids, max, d)
}
func (g *galeraBackend) sideCounts(ctx context.Context, log, hot string) (map[int64]int, int64, error) {
	return g.nodes[0].sideCounts(ctx, log, hot)
}
func (g *galeraBackend) sideLock(ctx context.Context, hot string, pause time.Duration) error {
	return g.nodes[0].sideLock(ctx, hot, pause)
}
func (g *galeraBackend) sideDDL(log, hot string) []string { return g.nodes[0].sideDDL(log, hot) }

// ---- the nodekill fault

// nodeKill is the nodekill fault's record.
type nodeKill struct {
	node      int   // 0-based
	at, back  int64 // SIGKILL; synced again
	evicted   int64 // node 1 saw the cluster without the dead node (commits stall until then)
	consumers []int // the consumers working on the node
	done      chan struct{}
}

// victimNode is the node the nodekill fault kills: node 2 (node 1 serves the parent).
const victimNode = 1

// nodeKillRun kills node victimNode with SIGKILL a third into the publishing, keeps it down
// for -node-down (leases of its consumers' rows run out; the other nodes' consumers take
// them), starts it again (it rejoins by state transfer) and waits until it is synced.
func (sc *scen) nodeKillRun(ctx context.Context, g *galeraBackend, nk *nodeKill) {
	defer close(nk.done)
	sleepCtx(ctx, sc.cfg.publishFor/3)
	if ctx.Err() != nil {
		return
	}
	var victims []*consumer
	for _, c := range sc.fl.all[:sc.s.procs] {
		if g.nodeOf(c.n) == nk.node {
			nk.consumers = append(nk.consumers, c.n)
			victims = append(victims, c)
		}
	}
	// Kill it while a handler of its consumers has run for a while (their history files
	// tell): a slow row's (-slow), whose settlement cannot have reached the node, so the
	// kill meets a delivery that another node's consumer must take over. After 15 s of
	// looking, kill it anyway.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; sleepCtx(ctx, 20*time.Millisecond) {
		if runningFor(victims, 300*time.Millisecond) >= 1 {
			break
		}
	}
	g.setDown(nk.node, true)
	nk.at = now()
	if out, err := galeraScript(ctx, sc.cfg.galeraScript, "kill", fmt.Sprint(nk.node+1)); err != nil {
		sc.asyncProblem("kill node %d: %v: %s", nk.node+1, err, out)
		return
	}
	sc.addFault(faultEvent{ns: nk.at, kind: "sessions", consumers: nk.consumers})
	sc.asyncFault("node_kills", 1)
	sc.event("SIGKILL galera node %d (consumers %v)", nk.node+1, nk.consumers)
	// Until the others evict the dead node (evs.suspect_timeout), commits wait for it.
	want := len(g.nodes) - 1
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; sleepCtx(ctx, 20*time.Millisecond) {
		var name string
		var size int
		if err := g.nodes[0].db.QueryRowContext(ctx, "SHOW STATUS LIKE 'wsrep_cluster_size'").Scan(&name, &size); err == nil && size == want {
			nk.evicted = now()
			break
		}
	}
	if nk.evicted == 0 {
		sc.asyncProblem("node 1 never saw the cluster shrink to %d nodes", want)
		nk.evicted = now()
	}
	sc.addFault(faultEvent{ns: nk.at, end: nk.evicted, kind: "evict"})
	sc.event("galera node %d evicted after %v", nk.node+1, time.Duration(nk.evicted-nk.at).Round(time.Millisecond))
	sleepCtx(ctx, sc.cfg.nodeDown-time.Duration(nk.evicted-nk.at))
	restarted := now()
	if out, err := galeraScript(context.WithoutCancel(ctx), sc.cfg.galeraScript, "start-node", fmt.Sprint(nk.node+1)); err != nil {
		sc.asyncProblem("start node %d again: %v: %s", nk.node+1, err, out)
		return
	}
	if out, err := galeraScript(context.WithoutCancel(ctx), sc.cfg.galeraScript, "wait-synced", fmt.Sprint(nk.node+1), "300"); err != nil {
		sc.asyncProblem("node %d did not sync again: %v: %s", nk.node+1, err, out)
		return
	}
	nk.back = now()
	g.setDown(nk.node, false)
	sc.addFault(faultEvent{ns: nk.at, end: nk.back, kind: "nodedown", consumers: nk.consumers})
	sc.addFault(faultEvent{ns: restarted, end: nk.back, kind: "rejoin"})
	sc.event("galera node %d synced again after %v", nk.node+1, time.Duration(nk.back-nk.at).Round(time.Millisecond))
}

// runningFor counts the handlers the consumers' history files show running for at least
// d: their rows' settlements cannot have reached the node yet, nor will they soon.
func runningFor(cs []*consumer, d time.Duration) int {
	n, cut := 0, now()-int64(d)
	for _, c := range cs {
		h, err := parseConsumer(c.out, c.n)
		if err != nil {
			continue
		}
		for _, dl := range h.deliveries {
			if dl.end == 0 && dl.settle == nil && dl.start <= cut {
				n++
			}
		}
	}
	return n
}

func galeraScript(ctx context.Context, script string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// checkNodeKill: the rows handled twice are rows in work on the killed node, or rows whose
// settlement failed, and said so, while the cluster was not whole. Each row with more than
// one handler run had every run but its last either
//   - in a consumer of the killed node, on a claim it held when the node died: not settled
//     before the kill, and started before the node was back (no claim reaches a dead node,
//     so a run that started while it was down was claimed before); or
//   - anywhere, in work during the outage (started before the node was back, still running
//     or settling after the kill), with a settlement reported failed: a lost lease or an
//     error. Until the others evict the dead node no node commits, extensions included, so
//     a 2 s lease runs out; a claim that waited in that stall returns with its lease nearly
//     spent and its handler starts after the eviction; a settlement can meet a node that
//     is leaving or rejoining. The service was told each time, and nothing was counted.
//
// Their count is bounded by those runs. It also counts the rows of the dead node's claims
// that the other nodes' consumers took and settled.
func checkNodeKill(h *history, nk *nodeKill, r *result, limit int) check {
	var c check
	if nk == nil || nk.at == 0 || nk.back == 0 {
		c.add(limit, "the node was never killed, or never synced again")
		return c
	}
	victim := map[int]bool{}
	for _, n := range nk.consumers {
		victim[n] = true
	}
	inWork := map[*delivery]bool{}
	for _, ds := range h.rows {
		for _, d := range ds {
			if victim[d.cons] && d.start < nk.back && (d.settle == nil || d.settle.t > nk.at) {
				inWork[d] = true
			}
		}
	}
	failedInOutage := map[*delivery]bool{}
	for _, ds := range h.rows {
		for _, d := range ds {
			failed := d.settle != nil && (d.settle.class == "leaselost" || d.settle.class == "error")
			if !inWork[d] && failed && d.start < nk.back && (d.end == 0 || d.end > nk.at) {
				failedInOutage[d] = true
			}
		}
	}
	twice, taken := 0, 0
	keys := append([]rowKey(nil), h.order...)
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].sub < keys[j].sub || keys[i].sub == keys[j].sub && keys[i].id < keys[j].id
	})
	for _, k := range keys {
		ds := h.rows[k]
		if len(ds) < 2 {
			continue
		}
		twice++
		fromDead := false
		for _, d := range ds[:len(ds)-1] {
			fromDead = fromDead || inWork[d]
			if !inWork[d] && !failedInOutage[d] {
				c.add(limit, "row %s was handled again after a run in consumer %d (attempt %d) that was neither in work on the killed node nor settled with a reported failure during the outage (settlement: %s)", k, d.cons, d.attempt, settleText(d.settle))
			}
		}
		if last := ds[len(ds)-1]; fromDead && !victim[last.cons] && last.settle != nil && last.settle.ok() {
			taken++
		}
	}
	r.NodeKillInWork, r.NodeKillTwice, r.NodeKillTakenOver, r.NodeKillOutageFailed = len(inWork), twice, taken, len(failedInOutage)
	r.NodeKillStallSeconds = float64(nk.evicted-nk.at) / 1e9
	r.NodeKillDownSeconds = float64(nk.back-nk.at) / 1e9
	if len(inWork) == 0 {
		c.add(limit, "the killed node's consumers had no row in work when it died: the fault proved nothing")
	}
	if twice > len(inWork)+len(failedInOutage) {
		c.add(limit, "%d rows handled twice, more than the %d in work on the killed node and the %d settlements that failed during the outage", twice, len(inWork), len(failedInOutage))
	}
	return c
}
