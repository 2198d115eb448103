package dialects

// TopErrors is how many error texts Stats lists per group: the most frequent among the
// group's rows that hold one (a failed row's error stays until an ack clears it, so these
// are the errors of rows still failing, delayed, dead-lettered or dropped).
const TopErrors = 3

// ErrorSummaryChars is how much of an error's text Stats groups and shows: errors that
// differ only beyond it count as one.
const ErrorSummaryChars = 200

// ErrorCount is how many of a group's rows hold one error text (its first
// ErrorSummaryChars characters).
type ErrorCount struct {
	Error string
	Rows  int64
}

// TopErrorsText is the statement Stats runs for a table with an error column: per group
// (when the table has groups: its first column, NULL for rows without a group) each error
// text's summary and its count, most frequent first. quote quotes an identifier.
func TopErrorsText(t Table, quote func(string) string) string { return topErrorsText(t, quote, false) }

// TopUnfinishedErrorsText is TopErrorsText over the unfinished rows only (QueueStats):
// those the claim index holds.
func TopUnfinishedErrorsText(t Table, quote func(string) string) string {
	return topErrorsText(t, quote, true)
}

func topErrorsText(t Table, quote func(string) string, unfinished bool) string {
	e := "substr(" + quote(t.Error) + ", 1, 200)"
	where := " WHERE " + quote(t.Error) + " IS NOT NULL"
	if unfinished && t.ProcessedAt != "" {
		where += " AND " + quote(t.ProcessedAt) + " IS NULL"
	}
	if t.Group == "" {
		return "SELECT " + e + ", count(*) FROM " + quote(t.Name) + where + " GROUP BY " + e + " ORDER BY 2 DESC, 1"
	}
	g := quote(t.Group)
	return "SELECT " + g + ", " + e + ", count(*) FROM " + quote(t.Name) + where + " GROUP BY " + g + ", " + e + " ORDER BY 1, 3 DESC, 2"
}

// AddTopError files one row of TopErrorsText's result in its group's stats, keeping the
// first TopErrors of each group. group is nil for the rows whose group is NULL, and
// ignored for a table without groups.
func AddTopError(stats []GroupStats, grouped bool, group *string, text string, rows int64) {
	for i := range stats {
		g := &stats[i]
		switch {
		case !grouped:
		case group == nil && !g.NullGroup, group != nil && (g.NullGroup || g.Group != *group):
			continue
		}
		if len(g.Errors) < TopErrors {
			g.Errors = append(g.Errors, ErrorCount{Error: text, Rows: rows})
		}
		return
	}
}

// Rows is what FileTopErrors reads: *sql.Rows and pgx.Rows both are.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// FileTopErrors reads TopErrorsText's result into stats (AddTopError).
func FileTopErrors(rows Rows, t Table, stats []GroupStats) error {
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
