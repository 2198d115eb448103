package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

// The operator's commands (dialects.Admin). Schema needs no database: cmd/rowactor renders
// it on the zero Dialect (TestZeroDialectSchema keeps that so).

var (
	_ dialects.Admin        = (*Dialect)(nil)
	_ dialects.QueueCounter = (*Dialect)(nil)
)

// heldKeys lists the 64-bit advisory keys held in this database by any session, as the
// advisory form locks them (pg_try_advisory_lock on one bigint: pg_locks shows its high
// half in classid and its low half in objid, with objsubid 1). Only exclusive locks: the
// shared ones are other consumers' candidate probes, gone a moment later.
const heldKeys = "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks AS l" +
	" WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'" +
	" AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"

// statsState classifies a row for Stats, by precedence: cancelled (JobCancelled), processed, in work (a lease not
// yet expired, or an advisory key some session holds), dead (dead_at set), delayed, due.
// Each test is false on NULL, so a NULL column never hides a row. The row lock form's locks cannot be listed
// without the pgrowlocks extension, so its rows in work read as due. usesNow says the
// text binds now as $1.
func statsState(t dialects.Table) (text string, usesNow bool, err error) {
	var b strings.Builder
	b.WriteString("CASE")
	b.WriteString(adminsql.CancelledState(t, quote, adminsql.CancelledTest))
	if t.ProcessedAt != "" {
		b.WriteString(" WHEN " + quote(t.ProcessedAt) + " IS NOT NULL THEN 0")
	}
	switch t.Form() {
	case dialects.FormLease:
		lu := quote(t.LockedUntil)
		b.WriteString(" WHEN " + lu + " IS NOT NULL AND " + lu + " > $1 THEN 1")
		usesNow = true
	case dialects.FormAdvisory:
		key, err := keyExpr(t.AdvisoryKey)
		if err != nil {
			return "", false, err
		}
		// A hashed subplan: pg_locks is read once per statement.
		b.WriteString(" WHEN hashtextextended(" + key + ", 0) IN (" + heldKeys + ") THEN 1")
	}
	if t.DeadAt != "" {
		// A dead letter waits for a requeue, whatever its retry_after.
		b.WriteString(" WHEN " + quote(t.DeadAt) + " IS NOT NULL THEN 4")
	}
	if t.RetryAfter != "" {
		ra := quote(t.RetryAfter)
		b.WriteString(" WHEN " + ra + " IS NOT NULL AND " + ra + " > $1 THEN 2")
		usesNow = true
	}
	if b.Len() == len("CASE") {
		// No column tells another state: every row is due.
		b.Reset()
		b.WriteString("3")
	} else {
		b.WriteString(" ELSE 3 END")
	}
	return b.String(), usesNow, nil
}

// statsText counts the rows of each group by state in one scan ($1 is now, when usesNow),
// and joins the due row with the lowest id (the next claim's) to read when it became due.
func statsText(t dialects.Table, unfinished bool) (text string, usesNow bool, err error) {
	state, usesNow, err := statsState(t)
	if err != nil {
		return "", false, err
	}
	tq, id := quote(t.Name), quote(t.ID)
	inner, g, groupBy := id+" AS i, "+state+" AS st", "''::text AS g", ""
	if t.Group != "" {
		inner, g, groupBy = quote(t.Group)+"::text AS g, "+inner, "g", " GROUP BY g"
	}
	s := "SELECT s.g, s.n_processed, s.n_in_work, s.n_delayed, s.n_due, s.n_dead, s.n_cancelled, s.oldest"
	for _, c := range []string{t.RetryAfter, t.LockedUntil, t.Headers} {
		if c != "" {
			s += ", r." + quote(c)
		}
	}
	return s + " FROM (SELECT " + g + ", count(*) FILTER (WHERE st = 0) AS n_processed, count(*) FILTER (WHERE st = 1) AS n_in_work," +
		" count(*) FILTER (WHERE st = 2) AS n_delayed, count(*) FILTER (WHERE st = 3) AS n_due, count(*) FILTER (WHERE st = 4) AS n_dead," +
		" count(*) FILTER (WHERE st = 5) AS n_cancelled," +
		" min(i) FILTER (WHERE st = 3) AS oldest" +
		" FROM (SELECT " + inner + " FROM " + tq + adminsql.UnfinishedWhere(t, quote, unfinished) + ") AS c" + groupBy + ") AS s" +
		" LEFT JOIN " + tq + " AS r ON r." + id + " = s.oldest ORDER BY s.g", usesNow, nil
}

// Stats counts the table's rows by group and state, in one statement that reads the whole
// table (and, for an advisory table, pg_locks once) and writes nothing. Rows in work are
// counted in the lease form and, through pg_locks, in the advisory form.
func (d *Dialect) Stats(ctx context.Context, t dialects.Table, now time.Time) ([]dialects.GroupStats, error) {
	return d.stats(ctx, t, now, false)
}

// QueueStats is Stats over the unfinished rows, read through the claim index where the
// table keeps finished rows (dialects.QueueCounter).
func (d *Dialect) QueueStats(ctx context.Context, t dialects.Table, now time.Time) ([]dialects.GroupStats, error) {
	return d.stats(ctx, t, now, true)
}

// stats counts all rows, or the unfinished ones.
func (d *Dialect) stats(ctx context.Context, t dialects.Table, now time.Time, unfinished bool) ([]dialects.GroupStats, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return nil, err
	}
	text, usesNow, err := statsText(t, unfinished)
	if err != nil {
		return nil, err
	}
	var args []any
	if usesNow {
		args = append(args, now)
	}
	rows, err := d.pool.Query(ctx, text, args...)
	if err != nil {
		return nil, adminErr("stats", t.Name, err)
	}
	defer rows.Close()
	var out []dialects.GroupStats
	for rows.Next() {
		var (
			g             dialects.GroupStats
			group         *string
			oldest        *int64
			retry, locked *time.Time
			headers       []byte
		)
		dest := []any{&group, &g.Processed, &g.InWork, &g.Delayed, &g.Due, &g.Dead, &g.Cancelled, &oldest}
		if t.RetryAfter != "" {
			dest = append(dest, &retry)
		}
		if t.LockedUntil != "" {
			dest = append(dest, &locked)
		}
		if t.Headers != "" {
			dest = append(dest, &headers)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, adminErr("stats", t.Name, err)
		}
		if group != nil {
			g.Group = *group
		} else {
			g.NullGroup = true
		}
		g.InWorkCounted = t.Form() != dialects.FormRowLock
		if oldest != nil {
			g.Oldest.ID = *oldest
		}
		if retry != nil {
			g.Oldest.RetryAfter = *retry
		}
		if locked != nil {
			g.Oldest.LockedUntil = *locked
		}
		g.Oldest.Headers = headers
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, adminErr("stats", t.Name, err)
	}
	rows.Close()
	if t.Error == "" {
		return out, nil
	}
	erows, err := d.pool.Query(ctx, errorsText(t, unfinished))
	if err != nil {
		return nil, adminErr("stats", t.Name, err)
	}
	defer erows.Close()
	if err := adminsql.FileTopErrors(erows, t, out); err != nil {
		return nil, adminErr("stats", t.Name, err)
	}
	return out, nil
}

// requeueSQL holds one requeue's statements.
type requeueSQL struct {
	ids   string // the source rows' ids in id order, locked: [$1 from group]
	count string // [$1 from group]
	// move moves a chunk: group move $1 to group, $2 ids, $3 from group; table move $1 ids.
	move string
}

// buildRequeue writes the statements of a requeue. A group move updates the rows in
// place; a table move deletes the rows from the dead-letter table and inserts them into
// the queue table with their ids, every column the two tables share (cols), in one
// statement (OVERRIDING SYSTEM VALUE keeps the ids even where the id is GENERATED
// ALWAYS). Both reset the attempt to 1 and clear retry_after, locked_until, processed_at
// and dead_at.
func buildRequeue(spec dialects.RequeueSpec, cols []adminsql.MoveColumn) requeueSQL {
	t := spec.Table
	id := quote(t.ID)
	if spec.FromGroup != "" {
		tq, gq := quote(t.Name), quote(t.Group)
		set := gq + " = $1"
		for _, c := range copyColumns(t) {
			if v := adminsql.RequeueValue(c.Role); v != "" {
				set += ", " + quote(c.Name) + " = " + v
			}
		}
		return requeueSQL{
			ids:   "SELECT " + id + " FROM " + tq + " WHERE " + gq + " = $1 ORDER BY " + id + " FOR UPDATE",
			count: "SELECT count(*) FROM " + tq + " WHERE " + gq + " = $1",
			move:  "UPDATE " + tq + " SET " + set + " WHERE " + id + " = ANY($2) AND " + gq + " = $3",
		}
	}
	from := quote(spec.FromTable)
	into, sel := adminsql.MoveLists(cols, true, quote, func(c adminsql.MoveColumn) string { return adminsql.RequeueValue(c.Role) })
	returning := make([]string, len(cols))
	for i, c := range cols {
		returning[i] = quote(c.DeadName)
	}
	return requeueSQL{
		ids:   "SELECT " + id + " FROM " + from + " ORDER BY " + id + " FOR UPDATE",
		count: "SELECT count(*) FROM " + from,
		move: "WITH moved AS (DELETE FROM " + from + " WHERE " + id + " = ANY($1) RETURNING " + strings.Join(returning, ", ") +
			") INSERT INTO " + quote(t.Name) + " (" + into + ") OVERRIDING SYSTEM VALUE SELECT " + sel + " FROM moved",
	}
}

// Requeue moves the dead letters back in one read committed transaction: it locks the
// source rows (FOR UPDATE, so a consumer of the dead-letter group holding one in a row
// lock claim makes it wait), moves them in chunks, and commits; a failure or the end of
// ctx rolls everything back. It checks the table (and the dead-letter table) first.
func (d *Dialect) Requeue(ctx context.Context, spec dialects.RequeueSpec, progress func(done, total int)) (int, error) {
	fromArgs, cols, err := adminsql.StartRequeue(ctx, spec, d.checkTable, d.deadLetterColumns)
	if err != nil {
		return 0, err
	}
	t := spec.Table
	s := buildRequeue(spec, cols)
	if spec.DryRun && len(spec.IDs) == 0 {
		var n int
		if err := d.pool.QueryRow(ctx, s.count, fromArgs...).Scan(&n); err != nil {
			return 0, adminErr("requeue count", t.Name, err)
		}
		return n, nil
	}
	tx, err := d.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, adminErr("requeue begin", t.Name, err)
	}
	moved, err := requeue(ctx, tx, spec, s, fromArgs, progress)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		// The rollback runs even when ctx is what ended the requeue; a rollback that
		// fails closes the connection, and the server rolls back.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		defer cancel()
		if rerr := tx.Rollback(rctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			err = errors.Join(err, rerr)
		}
		return 0, adminErr("requeue", t.Name, err)
	}
	return moved, nil
}

// requeue locks the source rows' ids and moves them chunk by chunk inside tx.
func requeue(ctx context.Context, tx pgx.Tx, spec dialects.RequeueSpec, s requeueSQL, fromArgs []any, progress func(done, total int)) (int, error) {
	rows, err := tx.Query(ctx, s.ids, fromArgs...)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, err
	}
	if ids, err = adminsql.PickRequeue(spec, ids); err != nil || spec.DryRun {
		return len(ids), err
	}
	return adminsql.RequeueChunks(ctx, ids, spec.Chunk, func(ctx context.Context, ids []int64) (int64, error) {
		args := []any{ids}
		if spec.FromGroup != "" {
			args = []any{spec.ToGroup, ids, spec.FromGroup}
		}
		tag, err := tx.Exec(ctx, s.move, args...)
		return tag.RowsAffected(), err
	}, progress)
}

func adminErr(op, table string, err error) error {
	return fmt.Errorf("postgres: %s on table %s: %w", op, table, err)
}

// errorsText is the statement of the most frequent errors, of all rows or the unfinished.
func errorsText(t dialects.Table, unfinished bool) string {
	if unfinished {
		return adminsql.TopUnfinishedErrorsText(t, quote)
	}
	return adminsql.TopErrorsText(t, quote, adminsql.CancelledTest)
}
