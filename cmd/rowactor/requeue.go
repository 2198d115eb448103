package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
)

var requeueCommand = &command{
	name:    "requeue",
	summary: "move dead letters back into their queue, in one transaction",
	help: `Usage: rowactor requeue [-dsn URL] -from-group G -to-group Q [-rows N,...] [-dry-run] [column flags] TABLE
       rowactor requeue [-dsn URL] -from-table T [-rows N,...] [-dry-run] [column flags] TABLE

Moves dead letters back into the queue, in one transaction:
  -from-group G -to-group Q  (a table with groups, -group given) every row of group G
                             moves to group Q; -to-group is required, even for ''
  -from-table T              every row of the dead-letter table T moves into TABLE with
                             its id and every column the two tables share, and leaves
                             T; columns TABLE computes are computed again (T has TABLE's
                             described columns and every column TABLE has as NOT NULL
                             without a default, as rowactor's dead-letter tables do)
-rows N,... moves only those rows of the source; one that is not there (a row of another
group, an id the dead-letter table does not hold) fails the requeue, and nothing moves.
Each moved row starts afresh: attempt 1, retry_after, locked_until, processed_at and
dead_at cleared (for the columns described). The rows are locked, then moved -chunk at a time,
and everything commits at once, or nothing does: an error, or Ctrl-C, rolls it all back.
It prints how many rows moved; -dry-run prints how many would, and changes nothing.
A -from-group with no rows at all is an error (exit status 1): a misspelt group reads
as an empty one.
Progress goes to stderr when there is more than one chunk: a bar on a terminal, a line
per tenth otherwise.

A row a consumer of the dead-letter group holds in work is moved all the same: its
lease is cleared (the consumer's settlement then reports ErrLeaseLost) or, in the row
lock form, the requeue waits for its transaction. Stop such consumers first.

Examples:
  rowactor requeue -dsn sqlite:jobs.db -group queue -attempt attempt -retry-after retry_after \
      -locked-until locked_until -from-group emails-dead -to-group emails -dry-run jobs
  rowactor requeue -group queue -attempt attempt -from-group emails-dead -to-group emails jobs
  rowactor requeue -dsn 'postgres://app@db/app' -attempt attempt -from-table jobs_dead jobs
  rowactor requeue -group queue -from-group emails-dead -to-group emails -rows 17,42 jobs
`,
}

func init() { requeueCommand.run = runRequeue }

func runRequeue(ctx context.Context, e *env, args []string) error {
	fs := newFlags(requeueCommand)
	dsnValue := dsnFlag(fs)
	var spec dialects.RequeueSpec
	fs.StringVar(&spec.FromGroup, "from-group", "", "the dead-letter group to move rows out of")
	fs.StringVar(&spec.ToGroup, "to-group", "", "the group the rows return to (required with -from-group)")
	fs.StringVar(&spec.FromTable, "from-table", "", "the dead-letter table to move rows out of (tables without groups)")
	fs.BoolVar(&spec.DryRun, "dry-run", false, "print how many rows would move, and change nothing")
	fs.IntVar(&spec.Chunk, "chunk", dialects.DefaultRequeueChunk, "rows moved per statement")
	fs.Func("rows", "move only these rows of the source (ids, comma-separated; repeatable)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return fmt.Errorf("%q is not a row id", f)
			}
			spec.IDs = append(spec.IDs, id)
		}
		return nil
	})
	var t rowactor.Table
	addTableFlags(fs, &t)
	rest, err := parse(e, requeueCommand, fs, args)
	if err != nil {
		return err
	}
	if err := tableArg(rest, &t); err != nil {
		return err
	}
	spec.Table = t
	if err := checkRequeueFlags(fs, spec); err != nil {
		return err
	}
	dsn, err := resolveDSN(e, *dsnValue)
	if err != nil {
		return err
	}
	admin, closeDB, err := openAdmin(ctx, dsn)
	if err != nil {
		return err
	}
	defer closeDB()
	bar := newProgress(e.stderr, spec.Chunk)
	n, err := admin.Requeue(ctx, spec, bar.update)
	bar.end()
	if err != nil {
		return err
	}
	if n == 0 && spec.FromGroup != "" {
		// A group is a value, not a name the database knows: a misspelt one would read as
		// an empty dead-letter group, and a script would go on as if rows had moved.
		return fmt.Errorf("no rows in group %q of table %s (column %s): nothing to move; check -from-group and -group",
			spec.FromGroup, t.Name, t.Group)
	}
	from := fmt.Sprintf("from table %s into table %s", spec.FromTable, t.Name)
	if spec.FromGroup != "" {
		from = fmt.Sprintf("from group %q to group %q in table %s", spec.FromGroup, spec.ToGroup, t.Name)
	}
	if spec.DryRun {
		fmt.Fprintf(e.stdout, "dry run: would move %s %s; nothing changed\n", rows(n), from)
		return nil
	}
	fmt.Fprintf(e.stdout, "moved %s %s\n", rows(n), from)
	return nil
}

// checkRequeueFlags refuses what the command line alone shows cannot run: the flags the
// source needs, and what dialects.CheckRequeue refuses before any database is asked.
func checkRequeueFlags(fs *flag.FlagSet, spec dialects.RequeueSpec) error {
	toGiven := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "to-group" {
			toGiven = true
		}
	})
	switch {
	case spec.FromGroup == "" && spec.FromTable == "":
		return usagef("name the dead letters: -from-group G -to-group Q, or -from-table T")
	case spec.FromGroup != "" && spec.FromTable != "":
		return usagef("-from-group and -from-table exclude each other")
	case spec.FromGroup != "" && !toGiven:
		return usagef("-from-group needs -to-group: name the group the rows return to (-to-group '' for the empty group)")
	case spec.FromTable != "" && toGiven:
		return usagef("-to-group goes with -from-group; rows from -from-table keep their group")
	case spec.FromGroup != "" && spec.Table.Group == "":
		return usagef("-from-group needs -group, the table's group column")
	case spec.Chunk <= 0:
		return usagef("-chunk must be at least 1")
	}
	if err := dialects.CheckRequeue(spec); err != nil {
		var ce *dialects.ConfigError
		if errors.As(err, &ce) {
			return &usageError{msg: describe(err)}
		}
		return err
	}
	return nil
}

func rows(n int) string {
	if n == 1 {
		return "1 row"
	}
	return fmt.Sprintf("%d rows", n)
}
