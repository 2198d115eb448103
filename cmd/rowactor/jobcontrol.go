package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/rowactor/rowactor"
)

var retryCommand = &command{
	name:    "retry",
	summary: "make a delayed row due now",
	help: `Usage: rowactor retry [-dsn URL] [column flags] TABLE ID

Clears row ID's retry_after (it needs -retry-after), in one statement: the row is due at
once and keeps its attempt. A row in work (a lease that has not run out; in the row lock
form, a row a claim holds; in the advisory form, a row whose key a session holds, which
SQLite sees in the consuming process only) is refused and left to its delivery, as is a
processed row; a row due already is no error. Exit status 1 for a refusal.

Describe the table as its consumers do: the form decides what counts as in work. A table
described with neither -locked-until nor -advisory-key is taken for the row lock form,
where only a claim's row lock tells a row in work; a lease or an advisory key would not
be seen.

Examples:
  rowactor retry -dsn sqlite:jobs.db -group queue -retry-after retry_after -locked-until locked_until jobs 42
  DATABASE_URL=postgres://app@db/app rowactor retry -retry-after retry_after -locked-until locked_until jobs 42
`,
}

var cancelCommand = &command{
	name:    "cancel",
	summary: "take a queued row out of its queue, as Cancel would",
	help: `Usage: rowactor cancel [-dsn URL] [-reason TEXT] [column flags] TABLE ID

Ends row ID as a handler's Cancel would, in one statement: it is deleted or, with
-processed-at, marked processed now, with "cancelled: " and -reason in the -error column
when there is one; stats and inspect then read it as cancelled.
A row in work is refused and left to its delivery, as is a processed row (see retry).
Exit status 1 for a refusal.

This command runs in a process of its own, which holds no delivery: it cancels queued rows
only. A row in work is cancelled by Broker.Cancel in the process whose subscription holds
it (its handler's context is cancelled and the row ends as cancelled), or once its
delivery gave it back to the queue.

Examples:
  rowactor cancel -dsn sqlite:jobs.db -group queue -locked-until locked_until \
      -processed-at processed_at -error error -reason 'customer left' jobs 42
  DATABASE_URL=postgres://app@db/app rowactor cancel -locked-until locked_until jobs 42
`,
}

func init() {
	retryCommand.run = func(ctx context.Context, e *env, args []string) error {
		return runJobControl(ctx, e, retryCommand, args)
	}
	cancelCommand.run = func(ctx context.Context, e *env, args []string) error {
		return runJobControl(ctx, e, cancelCommand, args)
	}
}

func runJobControl(ctx context.Context, e *env, c *command, args []string) error {
	fs := newFlags(c)
	dsnValue := dsnFlag(fs)
	reason := "by rowactor cancel"
	if c == cancelCommand {
		fs.StringVar(&reason, "reason", reason, `the text written in the error column, after "cancelled: "`)
	}
	var t rowactor.Table
	addTableFlags(fs, &t)
	b, id, closeDB, err := openRow(ctx, e, c, fs, args, dsnValue, &t)
	if err != nil {
		return err
	}
	defer closeDB()
	if c == retryCommand {
		if err := b.RetryNow(ctx, t, id); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "row %d of %s is due now\n", id, t.Name)
		return nil
	}
	if err := b.Cancel(ctx, t, id, reason); err != nil {
		if errors.Is(err, rowactor.ErrInWork) {
			// This process holds no delivery: only the consumer's process can cancel one.
			return fmt.Errorf("%w; rowactor cancel runs in its own process and cancels queued rows only: "+
				"cancel a row in work with Broker.Cancel in the process that holds it, or again once its delivery gave it back", err)
		}
		return err
	}
	fmt.Fprintf(e.stdout, "row %d of %s cancelled\n", id, t.Name)
	return nil
}
