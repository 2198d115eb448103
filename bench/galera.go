package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
)

// -db galera: the lease form on the three nodes of scripts/galera.sh. Each contender
// spreads over the nodes: rowactor runs a broker per node, each with -workers workers;
// the raw loops run -workers goroutines per node. The table is created and filled through
// node 1.

// openGalera opens a pool per node (the DSNs of -galera, comma-separated).
func openGalera(ctx context.Context, dsns string) (*target, error) {
	var pools []*mysql.Dialect
	closeAll := func() {
		for _, d := range pools {
			d.Close()
		}
	}
	for i, dsn := range strings.Split(dsns, ",") {
		d, err := mysql.Open(ctx, strings.TrimSpace(dsn))
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("galera node %d: %w (start the cluster with bash scripts/galera.sh start)", i+1, err)
		}
		pools = append(pools, d)
		var name, wsrep string
		if err := d.DB().QueryRowContext(ctx, "SHOW VARIABLES LIKE 'wsrep_on'").Scan(&name, &wsrep); err != nil || wsrep != "ON" {
			closeAll()
			return nil, fmt.Errorf("galera node %d (%s) is not a cluster node (wsrep_on %q, %v)", i+1, dsn, wsrep, err)
		}
	}
	tg := sqlTarget("galera", pools[0], pools[0].DB())
	tg.costs = mysqlCosts
	if err := pools[0].DB().QueryRowContext(ctx, "SELECT VERSION()").Scan(&tg.version); err != nil {
		closeAll()
		return nil, err
	}
	tg.version += fmt.Sprintf(", %d Galera nodes, a pool of %d each", len(pools), pools[0].DB().Stats().MaxOpenConnections)
	for _, d := range pools {
		tg.nodes = append(tg.nodes, d)
	}
	tg.settle = func(context.Context, string) error { return nil }
	tg.close = closeAll
	return tg, nil
}

// pools are the dialects a contender spreads over: the nodes of a cluster, else the one.
func (tg *target) pools() []dialects.Dialect {
	if len(tg.nodes) > 0 {
		return tg.nodes
	}
	return []dialects.Dialect{tg.d}
}

// openQueues opens the table's queue on every pool. On a cluster the lease queues retry
// what certification aborted (contended).
func (tg *target) openQueues(ctx context.Context, spec dialects.QueueSpec) ([]dialects.Queue, func(), error) {
	var qs []dialects.Queue
	closeAll := func() {
		for _, q := range qs {
			q.Close()
		}
	}
	for _, d := range tg.pools() {
		q, err := d.Open(ctx, spec)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		if lq, ok := q.(dialects.LeaseBatchQueue); ok && len(tg.nodes) > 0 {
			q = contended{LeaseBatchQueue: lq, d: d, retries: &tg.retries}
		}
		qs = append(qs, q)
	}
	return qs, closeAll, nil
}

// spread hands each of the loops runLoops starts a queue, in turn.
func spread[Q any](qs []dialects.Queue) func() Q {
	var next atomic.Int64
	return func() Q { return qs[int(next.Add(1)-1)%len(qs)].(Q) }
}

// contended retries a lease queue's claims and settlements that a cluster aborted with a
// deadlock (a conflict found at certification): nothing of them was kept, and a
// settlement is fenced by its token. rowactor's own claimer and settler do the same.
type contended struct {
	dialects.LeaseBatchQueue
	d       dialects.Dialect
	retries *atomic.Int64
}

func (q contended) again(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || dialects.Classify(q.d, err) != dialects.FaultContention {
		return false
	}
	q.retries.Add(1)
	time.Sleep(time.Millisecond)
	return true
}

func (q contended) ClaimLeases(ctx context.Context, now, until time.Time, limit int) ([]dialects.Row, error) {
	for {
		rows, err := q.LeaseBatchQueue.ClaimLeases(ctx, now, until, limit)
		if !q.again(ctx, err) {
			return rows, err
		}
	}
}

func (q contended) SettleLease(ctx context.Context, step dialects.Step, held dialects.Lease) (bool, error) {
	for {
		ok, err := q.LeaseBatchQueue.SettleLease(ctx, step, held)
		if !q.again(ctx, err) {
			return ok, err
		}
	}
}

func (q contended) SettleLeases(ctx context.Context, kind dialects.StepKind, now time.Time, held []dialects.Lease) ([]int64, error) {
	for {
		ids, err := q.LeaseBatchQueue.SettleLeases(ctx, kind, now, held)
		if !q.again(ctx, err) {
			return ids, err
		}
	}
}

// withBrokers gives a target n-1 more pools on its server (-brokers n), opened by open:
// the contenders spread over them as over a cluster's nodes, as n consumer processes
// would. The driver then counts the first pool's statements only, so that count is
// dropped.
func withBrokers(ctx context.Context, n int, open func(context.Context) (dialects.Dialect, error)) func(*target, error) (*target, error) {
	return func(tg *target, err error) (*target, error) {
		if err != nil || n <= 1 {
			return tg, err
		}
		tg.nodes = []dialects.Dialect{tg.d}
		tg.driverStmts = nil
		closeFirst := tg.close
		tg.close = func() {
			for _, d := range tg.nodes[1:] {
				d.Close()
			}
			closeFirst()
		}
		for range n - 1 {
			d, err := open(ctx)
			if err != nil {
				tg.close()
				return nil, err
			}
			tg.nodes = append(tg.nodes, d)
		}
		tg.version += fmt.Sprintf(", %d pools", n)
		return tg, nil
	}
}
