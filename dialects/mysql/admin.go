package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/internal/adminsql"
)

// The operator's commands (dialects.Admin). Schema needs no database: cmd/rowactor renders
// it on the zero Dialect (TestZeroDialectSchema keeps that so).

var (
	_ dialects.Admin        = (*Dialect)(nil)
	_ dialects.QueueCounter = (*Dialect)(nil)
)

// statsState classifies a row for Stats, by precedence: cancelled (JobCancelled), processed, in work (a lease not
// yet expired, or an advisory key some session holds, by IS_USED_LOCK on the name the
// advisory form locks), dead (dead_at set), delayed, due. Each test is false on NULL, so a NULL column never
// hides a row. It returns how many times it binds now. The row lock form's locks are not
// listed (performance_schema.data_locks needs privileges and differs between MySQL and
// MariaDB), so its rows in work read as due.
func statsState(t dialects.Table) (string, int, error) {
	var b strings.Builder
	nows := 0
	b.WriteString("CASE")
	b.WriteString(adminsql.CancelledState(t, quote, cancelledTest))
	if t.ProcessedAt != "" {
		b.WriteString(" WHEN " + quote(t.ProcessedAt) + " IS NOT NULL THEN 0")
	}
	switch t.Form() {
	case dialects.FormLease:
		lu := quote(t.LockedUntil)
		b.WriteString(" WHEN " + lu + " IS NOT NULL AND " + lu + " > ? THEN 1")
		nows++
	case dialects.FormAdvisory:
		key, err := keyText(t.AdvisoryKey)
		if err != nil {
			return "", 0, err
		}
		b.WriteString(" WHEN IS_USED_LOCK(" + lockNameExpr(key) + ") IS NOT NULL THEN 1")
	}
	if t.DeadAt != "" {
		// A dead letter waits for a requeue, whatever its retry_after.
		b.WriteString(" WHEN " + quote(t.DeadAt) + " IS NOT NULL THEN 4")
	}
	if t.RetryAfter != "" {
		ra := quote(t.RetryAfter)
		b.WriteString(" WHEN " + ra + " IS NOT NULL AND " + ra + " > ? THEN 2")
		nows++
	}
	if b.Len() == len("CASE") {
		// No column tells another state: every row is due.
		b.Reset()
		b.WriteString("3")
	} else {
		b.WriteString(" ELSE 3 END")
	}
	return b.String(), nows, nil
}

// statsText counts the rows of each group by state in one scan, and joins the due row
// with the lowest id (the next claim's) to read when it became due.
func statsText(t dialects.Table, unfinished bool) (string, int, error) {
	state, nows, err := statsState(t)
	if err != nil {
		return "", 0, err
	}
	tq, id := quote(t.Name), quote(t.ID)
	inner, g, groupBy := id+" AS i, "+state+" AS st", "'' AS g", ""
	if t.Group != "" {
		inner, g, groupBy = quote(t.Group)+" AS g, "+inner, "g", " GROUP BY g"
	}
	s := "SELECT s.g, s.n_processed, s.n_in_work, s.n_delayed, s.n_due, s.n_dead, s.n_cancelled, s.oldest"
	for _, c := range []string{t.RetryAfter, t.LockedUntil, t.Headers} {
		if c != "" {
			s += ", r." + quote(c)
		}
	}
	return s + " FROM (SELECT " + g + ", COUNT(CASE WHEN st = 0 THEN 1 END) AS n_processed, COUNT(CASE WHEN st = 1 THEN 1 END) AS n_in_work," +
		" COUNT(CASE WHEN st = 2 THEN 1 END) AS n_delayed, COUNT(CASE WHEN st = 3 THEN 1 END) AS n_due, COUNT(CASE WHEN st = 4 THEN 1 END) AS n_dead," +
		" COUNT(CASE WHEN st = 5 THEN 1 END) AS n_cancelled," +
		" MIN(CASE WHEN st = 3 THEN i END) AS oldest" +
		" FROM (SELECT " + inner + " FROM " + tq + adminsql.UnfinishedWhere(t, quote, unfinished) + ") AS c" + groupBy + ") AS s" +
		" LEFT JOIN " + tq + " AS r ON r." + id + " = s.oldest ORDER BY s.g", nows, nil
}

// Stats counts the table's rows by group and state, in one statement that reads the whole
// table and writes nothing (an advisory table runs IS_USED_LOCK once per unprocessed
// row). Rows in work are counted in the lease and advisory forms.
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
	text, nows, err := statsText(t, unfinished)
	if err != nil {
		return nil, err
	}
	args := make([]any, nows)
	for i := range args {
		args[i] = dbTime(now)
	}
	rows, err := d.db.QueryContext(ctx, text, args...)
	if err != nil {
		return nil, adminErr("stats", t.Name, err)
	}
	defer rows.Close()
	var out []dialects.GroupStats
	for rows.Next() {
		var (
			g             dialects.GroupStats
			group         sql.NullString
			oldest        sql.NullInt64
			retry, locked sql.NullTime
		)
		dest := []any{&group, &g.Processed, &g.InWork, &g.Delayed, &g.Due, &g.Dead, &g.Cancelled, &oldest}
		if t.RetryAfter != "" {
			dest = append(dest, &retry)
		}
		if t.LockedUntil != "" {
			dest = append(dest, &locked)
		}
		if t.Headers != "" {
			dest = append(dest, &g.Oldest.Headers)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, adminErr("stats", t.Name, err)
		}
		g.Group, g.NullGroup = group.String, !group.Valid
		g.InWorkCounted = t.Form() != dialects.FormRowLock
		g.Oldest.ID = oldest.Int64
		g.Oldest.RetryAfter = retry.Time
		g.Oldest.LockedUntil = locked.Time
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, adminErr("stats", t.Name, err)
	}
	rows.Close()
	if t.Error == "" {
		return out, nil
	}
	erows, err := d.db.QueryContext(ctx, errorsText(t, unfinished))
	if err != nil {
		return nil, adminErr("stats", t.Name, err)
	}
	defer erows.Close()
	if err := adminsql.FileTopErrors(erows, t, out); err != nil {
		return nil, adminErr("stats", t.Name, err)
	}
	return out, nil
}

// requeueSQL holds one requeue's statements: the source's ids, and the move of a chunk of
// them, whose IN list the chunk's size fills.
type requeueSQL struct {
	ids   string // the source rows' ids in id order, locked: [from group]
	count string // [from group]
	// moveHead + placeholders + moveTail moves a chunk: [to group,] ids..., [from group]
	moveHead, moveTail string
	// deleteHead + placeholders + ")" deletes a chunk from the dead-letter table: ids...
	deleteHead string
}

// buildRequeue writes the statements of a requeue. A group move updates the rows in
// place; a table move copies the rows into the queue table with their ids, every column
// the two tables share (cols), and deletes them from the dead-letter table. Both reset
// the attempt to 1 and clear retry_after, locked_until, processed_at and dead_at.
func buildRequeue(spec dialects.RequeueSpec, cols []adminsql.MoveColumn) requeueSQL {
	t := spec.Table
	id := quote(t.ID)
	if spec.FromGroup != "" {
		tq, gq := quote(t.Name), quote(t.Group)
		set := gq + " = ?"
		for _, c := range copyColumns(t) {
			if v := adminsql.RequeueValue(c.Role); v != "" {
				set += ", " + quote(c.Name) + " = " + v
			}
		}
		return requeueSQL{
			ids:      "SELECT " + id + " FROM " + tq + " WHERE " + gq + " = ? ORDER BY " + id + " FOR UPDATE",
			count:    "SELECT COUNT(*) FROM " + tq + " WHERE " + gq + " = ?",
			moveHead: "UPDATE " + tq + " SET " + set + " WHERE " + id + " IN (",
			moveTail: ") AND " + gq + " = ?",
		}
	}
	from := quote(spec.FromTable)
	into, sel := adminsql.MoveLists(cols, true, quote, func(c adminsql.MoveColumn) string { return adminsql.RequeueValue(c.Role) })
	return requeueSQL{
		ids:        "SELECT " + id + " FROM " + from + " ORDER BY " + id + " FOR UPDATE",
		count:      "SELECT COUNT(*) FROM " + from,
		moveHead:   "INSERT INTO " + quote(t.Name) + " (" + into + ") SELECT " + sel + " FROM " + from + " WHERE " + id + " IN (",
		moveTail:   ")",
		deleteHead: "DELETE FROM " + from + " WHERE " + id + " IN (",
	}
}

// Requeue moves the dead letters back in one READ COMMITTED transaction on a connection
// of its own: it locks the source rows (FOR UPDATE, so a consumer holding one in a row
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
		if err := d.db.QueryRowContext(ctx, s.count, fromArgs...).Scan(&n); err != nil {
			return 0, adminErr("requeue count", t.Name, err)
		}
		return n, nil
	}
	x, err := d.begin(ctx, sql.LevelReadCommitted)
	if err != nil {
		return 0, adminErr("requeue begin", t.Name, err)
	}
	moved, err := d.requeue(ctx, x.tx, spec, s, fromArgs, progress)
	if err != nil {
		if rerr := x.rollback(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return 0, adminErr("requeue", t.Name, err)
	}
	if err := x.commit(); err != nil {
		return 0, adminErr("requeue commit", t.Name, err)
	}
	return moved, nil
}

// requeue locks the source rows' ids and moves them chunk by chunk inside tx.
func (d *Dialect) requeue(ctx context.Context, tx *sql.Tx, spec dialects.RequeueSpec, s requeueSQL, fromArgs []any, progress func(done, total int)) (int, error) {
	rows, err := tx.QueryContext(ctx, s.ids, fromArgs...)
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if ids, err = adminsql.PickRequeue(spec, ids); err != nil || spec.DryRun {
		return len(ids), err
	}
	return adminsql.RequeueChunks(ctx, ids, spec.Chunk, func(ctx context.Context, ids []int64) (int64, error) {
		var args []any
		if spec.FromGroup != "" {
			args = append(args, spec.ToGroup)
		}
		for _, id := range ids {
			args = append(args, id)
		}
		n, err := affected(tx.ExecContext(ctx, s.moveHead+placeholders(len(ids))+s.moveTail, append(args, fromArgs...)...))
		if err != nil || s.deleteHead == "" {
			return n, err
		}
		deleted, err := affected(tx.ExecContext(ctx, s.deleteHead+placeholders(len(ids))+")", args...))
		if err == nil && deleted != n {
			n = deleted // RequeueChunks reports the mismatch
		}
		return n, err
	}, progress)
}

func adminErr(op, table string, err error) error {
	return (&queue{name: table}).errorf(op, err)
}

// cancelledTest is adminsql.CancelledTest compared as binary strings: MySQL's collations
// ignore case and trailing spaces.
func cancelledTest(col string) string {
	n := strconv.Itoa(len(dialects.CancelledPrefix))
	return "CAST(substr(" + col + ", 1, " + n + ") AS BINARY) = '" + dialects.CancelledPrefix + "'"
}

// errorsText is the statement of the most frequent errors, of all rows or the unfinished.
func errorsText(t dialects.Table, unfinished bool) string {
	if unfinished {
		return adminsql.TopUnfinishedErrorsText(t, quote)
	}
	return adminsql.TopErrorsText(t, quote, cancelledTest)
}
