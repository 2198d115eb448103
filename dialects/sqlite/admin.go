package sqlite

import (
	"context"
	"database/sql"
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

// statsState classifies a row for Stats, by precedence: cancelled (JobCancelled), processed, in work (a lease not yet
// expired), dead (dead_at set), delayed, due. Each test is false on NULL, so a NULL column never hides a row.
// SQLite's advisory keys live in the consuming process, so an advisory row in work reads
// as due. Times are TimeLayout text: comparing the text compares the times. usesNow says
// the text binds :now.
func statsState(t dialects.Table) (text string, usesNow bool) {
	var b strings.Builder
	b.WriteString("CASE")
	b.WriteString(adminsql.CancelledState(t, quote, adminsql.CancelledTest))
	if t.ProcessedAt != "" {
		b.WriteString(" WHEN " + quote(t.ProcessedAt) + " IS NOT NULL THEN 0")
	}
	if t.Form() == dialects.FormLease {
		lu := quote(t.LockedUntil)
		b.WriteString(" WHEN " + lu + " IS NOT NULL AND " + lu + " > :now THEN 1")
		usesNow = true
	}
	if t.DeadAt != "" {
		// A dead letter waits for a requeue, whatever its retry_after.
		b.WriteString(" WHEN " + quote(t.DeadAt) + " IS NOT NULL THEN 4")
	}
	if t.RetryAfter != "" {
		ra := quote(t.RetryAfter)
		b.WriteString(" WHEN " + ra + " IS NOT NULL AND " + ra + " > :now THEN 2")
		usesNow = true
	}
	if b.Len() == len("CASE") {
		// No column tells another state: every row is due.
		b.Reset()
		b.WriteString("3")
	} else {
		b.WriteString(" ELSE 3 END")
	}
	return b.String(), usesNow
}

// statsText counts the rows of each group by state in one scan, and joins the due row
// with the lowest id (the next claim's) to read when it became due.
func statsText(t dialects.Table, unfinished bool) (text string, usesNow bool) {
	state, usesNow := statsState(t)
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
	return s + " FROM (SELECT " + g + ", count(CASE WHEN st = 0 THEN 1 END) AS n_processed, count(CASE WHEN st = 1 THEN 1 END) AS n_in_work," +
		" count(CASE WHEN st = 2 THEN 1 END) AS n_delayed, count(CASE WHEN st = 3 THEN 1 END) AS n_due, count(CASE WHEN st = 4 THEN 1 END) AS n_dead," +
		" count(CASE WHEN st = 5 THEN 1 END) AS n_cancelled," +
		" min(CASE WHEN st = 3 THEN i END) AS oldest" +
		" FROM (SELECT " + inner + " FROM " + tq + adminsql.UnfinishedWhere(t, quote, unfinished) + ")" + groupBy + ") AS s" +
		" LEFT JOIN " + tq + " AS r ON r." + id + " = s.oldest ORDER BY s.g", usesNow
}

// Stats counts the table's rows by group and state, in one statement that reads the whole
// table and writes nothing.
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
	text, usesNow := statsText(t, unfinished)
	var args []any
	if usesNow {
		args = append(args, sql.Named("now", formatTime(now)))
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
			retry, locked sql.NullString
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
		g.InWorkCounted = t.Form() == dialects.FormLease
		g.Oldest.ID = oldest.Int64
		g.Oldest.RetryAfter = statsTime(retry)
		g.Oldest.LockedUntil = statsTime(locked)
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

// statsTime reads a time column; NULL, and text not in TimeLayout (written by other code),
// read as unknown.
func statsTime(s sql.NullString) time.Time {
	if !s.Valid {
		return time.Time{}
	}
	t, err := time.Parse(TimeLayout, s.String)
	if err != nil {
		return time.Time{}
	}
	return t
}

// requeueSQL holds one requeue's statements: the source's ids, and the move of a chunk of
// them, whose IN list the chunk's size fills.
type requeueSQL struct {
	ids   string // the source rows' ids in id order: [from group]
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
			ids:      "SELECT " + id + " FROM " + tq + " WHERE " + gq + " = ? ORDER BY " + id,
			count:    "SELECT count(*) FROM " + tq + " WHERE " + gq + " = ?",
			moveHead: "UPDATE " + tq + " SET " + set + " WHERE " + id + " IN (",
			moveTail: ") AND " + gq + " = ?",
		}
	}
	from := quote(spec.FromTable)
	into, sel := adminsql.MoveLists(cols, true, quote, func(c adminsql.MoveColumn) string { return adminsql.RequeueValue(c.Role) })
	return requeueSQL{
		ids:        "SELECT " + id + " FROM " + from + " ORDER BY " + id,
		count:      "SELECT count(*) FROM " + from,
		moveHead:   "INSERT INTO " + quote(t.Name) + " (" + into + ") SELECT " + sel + " FROM " + from + " WHERE " + id + " IN (",
		moveTail:   ")",
		deleteHead: "DELETE FROM " + from + " WHERE " + id + " IN (",
	}
}

// Requeue moves the dead letters back in one BEGIN IMMEDIATE transaction, in this
// process's writer turn: every other writer on the file waits until it commits, and a
// reader sees the rows before or after, never half moved. It checks the table (and the
// dead-letter table) first.
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
	f, err := d.fileEntry(ctx)
	if err != nil {
		return 0, err
	}
	q := &queue{d: d, f: f, name: t.Name}
	moved := 0
	_, err = q.immediate(ctx, "requeue", func(conn *sql.Conn) (bool, error) {
		rows, err := conn.QueryContext(ctx, s.ids, fromArgs...)
		if err != nil {
			return false, q.errorf("requeue", err)
		}
		ids, err := scanIDs(rows)
		if err != nil {
			return false, q.errorf("requeue", err)
		}
		if ids, err = adminsql.PickRequeue(spec, ids); err != nil || spec.DryRun {
			moved = len(ids)
			if err != nil {
				err = q.errorf("requeue", err)
			}
			return false, err // a dry run, or a named row missing: nothing changes
		}
		moved, err = adminsql.RequeueChunks(ctx, ids, spec.Chunk, func(ctx context.Context, ids []int64) (int64, error) {
			var args []any
			if spec.FromGroup != "" {
				args = append(args, spec.ToGroup)
			}
			for _, id := range ids {
				args = append(args, id)
			}
			n, err := changed(conn.ExecContext(ctx, s.moveHead+inList(len(ids))+s.moveTail, append(args, fromArgs...)...))
			if err != nil || s.deleteHead == "" {
				return n, err
			}
			deleted, err := changed(conn.ExecContext(ctx, s.deleteHead+inList(len(ids))+")", args...))
			if err == nil && deleted != n {
				n = deleted // RequeueChunks reports the mismatch
			}
			return n, err
		}, progress)
		if err != nil {
			return false, q.errorf("requeue", err)
		}
		return true, nil
	})
	if err != nil {
		return 0, err
	}
	return moved, nil
}

// inList renders n comma-separated "?".
func inList(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}

func adminErr(op, table string, err error) error {
	return (&queue{name: table}).errorf(op, err)
}

// errorsText is the statement of the most frequent errors, of all rows or the unfinished.
func errorsText(t dialects.Table, unfinished bool) string {
	if unfinished {
		return adminsql.TopUnfinishedErrorsText(t, quote)
	}
	return adminsql.TopErrorsText(t, quote, adminsql.CancelledTest)
}

// QueuedStatement returns the statement that reads the id and payload of each row of t
// queued for group, in id order, and its arguments. A queued row is unfinished; group is
// ignored for a table without a group column. rowactortest reads what a test published
// with it.
func (d *Dialect) QueuedStatement(t dialects.Table, group string) (string, []any) {
	text := adminsql.QueuedText(t, quote, ":group")
	if t.Group == "" {
		return text, nil
	}
	return text, []any{sql.Named("group", group)}
}
