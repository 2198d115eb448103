package adminsql

import (
	"strconv"

	"github.com/rowactor/rowactor/dialects"
)

// TopErrors is how many error texts Stats lists per group: the most frequent among the
// group's rows that hold one (a failed row's error stays until an ack clears it, so these
// are the errors of rows still failing, delayed, dead-lettered or dropped).
const TopErrors = 3

// ErrorSummaryChars is how much of an error's text Stats groups and shows: errors that
// differ only beyond it count as one.
const ErrorSummaryChars = 200

// TopErrorsText is the statement Stats runs for a table with an error column: per group
// (when the table has groups: its first column, NULL for rows without a group) each error
// text's summary and its count, most frequent first. quote quotes an identifier;
// cancelled is the dialect's CancelledTest, which leaves out the reasons of cancelled
// rows (kept only where the table has processed_at): they are no failures.
func TopErrorsText(t dialects.Table, quote, cancelled func(string) string) string {
	return topErrorsText(t, quote, cancelled, false)
}

// TopUnfinishedErrorsText is TopErrorsText over the unfinished rows only (QueueStats):
// those the claim index holds. No cancelled row is among them.
func TopUnfinishedErrorsText(t dialects.Table, quote func(string) string) string {
	return topErrorsText(t, quote, nil, true)
}

func topErrorsText(t dialects.Table, quote, cancelled func(string) string, unfinished bool) string {
	e := "substr(" + quote(t.Error) + ", 1, 200)"
	where := " WHERE " + quote(t.Error) + " IS NOT NULL"
	switch {
	case unfinished && t.ProcessedAt != "":
		where += " AND " + quote(t.ProcessedAt) + " IS NULL"
	case !unfinished && t.ProcessedAt != "":
		where += " AND NOT (" + cancelled(quote(t.Error)) + ")"
	}
	if t.Group == "" {
		return "SELECT " + e + ", count(*) FROM " + quote(t.Name) + where + " GROUP BY " + e + " ORDER BY 2 DESC, 1"
	}
	g := quote(t.Group)
	return "SELECT " + g + ", " + e + ", count(*) FROM " + quote(t.Name) + where + " GROUP BY " + g + ", " + e + " ORDER BY 1, 3 DESC, 2"
}

// CancelledTest is the SQL test that the error column col (quoted) holds a cancellation's
// reason: it starts with dialects.CancelledPrefix, compared byte for byte (substr, not
// LIKE, which SQLite and MySQL read without case). MySQL wraps it to compare binary
// strings (its collations ignore case and trailing spaces).
func CancelledTest(col string) string {
	return "substr(" + col + ", 1, " + strconv.Itoa(len(dialects.CancelledPrefix)) + ") = '" + dialects.CancelledPrefix + "'"
}

// CancelledState is the CASE arm a state expression puts before processed's: a row kept
// with processed_at whose error a cancellation wrote reads as JobCancelled. Empty for a
// table without processed_at or an error column. test is the dialect's CancelledTest.
func CancelledState(t dialects.Table, quote, test func(string) string) string {
	if t.ProcessedAt == "" || t.Error == "" {
		return ""
	}
	return " WHEN " + quote(t.ProcessedAt) + " IS NOT NULL AND " + quote(t.Error) + " IS NOT NULL AND " + test(quote(t.Error)) +
		" THEN " + strconv.Itoa(int(dialects.JobCancelled))
}

// AddTopError files one row of TopErrorsText's result in its group's stats, keeping the
// first TopErrors of each group. group is nil for the rows whose group is NULL, and
// ignored for a table without groups.
func AddTopError(stats []dialects.GroupStats, grouped bool, group *string, text string, rows int64) {
	for i := range stats {
		g := &stats[i]
		switch {
		case !grouped:
		case group == nil && !g.NullGroup, group != nil && (g.NullGroup || g.Group != *group):
			continue
		}
		if len(g.Errors) < TopErrors {
			g.Errors = append(g.Errors, dialects.ErrorCount{Error: text, Rows: rows})
		}
		return
	}
}

// FileTopErrors reads TopErrorsText's result into stats (AddTopError).
func FileTopErrors(rows dialects.Rows, t dialects.Table, stats []dialects.GroupStats) error {
	for rows.Next() {
		var (
			group *string
			text  string
			n     int64
		)
		dest := []any{&text, &n}
		if t.Group != "" {
			dest = append([]any{&group}, dest...)
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		AddTopError(stats, t.Group != "", group, text, n)
	}
	return rows.Err()
}
