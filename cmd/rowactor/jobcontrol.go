package main

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	summary: "cancel a row, as Broker.Cancel would: queued at once, in work through its holder",
	help: `Usage: rowactor cancel [-dsn URL] [-reason TEXT] [column flags] TABLE ID

Ends row ID as a handler's Cancel would, in one statement: it is deleted or, with
-processed-at, marked processed now, with "cancelled: " and -reason in the -error column
when there is one; stats and inspect then read it as cancelled.
A processed row is refused (see retry). Exit status 1 for a refusal.

A row in work is cancelled in the process that holds it when the table has a
cancel-request table (-cancel-requests, Table.CancelRequests): the request is recorded
there, the holder reads it within half a second, cancels its handler's context and ends
the row as cancelled, and the command waits for that, up to -wait. When -wait runs out
first, the request is withdrawn and the command exits 1 saying so. Without
-cancel-requests a row in work is refused and left to its delivery.

Examples:
  rowactor cancel -dsn sqlite:jobs.db -group queue -locked-until locked_until \
      -processed-at processed_at -error error -reason 'customer left' jobs 42
  DATABASE_URL=postgres://app@db/app rowactor cancel -locked-until locked_until jobs 42
  rowactor cancel -dsn sqlite:jobs.db -locked-until locked_until -processed-at processed_at \
      -cancel-requests jobs_cancels -wait 10s jobs 42
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
	wait := 30 * time.Second
	if c == cancelCommand {
		fs.StringVar(&reason, "reason", reason, `the text written in the error column, after "cancelled: "`)
		fs.DurationVar(&wait, "wait", wait, "with -cancel-requests, how long to wait for the process holding a row in work to cancel it")
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
	wctx, stop := context.WithTimeout(ctx, wait)
	defer stop()
	if err := b.Cancel(wctx, t, id, reason); err != nil {
		if errors.Is(err, rowactor.ErrInWork) && t.CancelRequests == "" {
			// This process holds no delivery, and the table has no way to reach the one
			// that does.
			return fmt.Errorf("%w; without -cancel-requests rowactor cancel reaches queued rows only: "+
				"give the table a cancel-request table (Table.CancelRequests), or cancel the row with Broker.Cancel in the process that holds it", err)
		}
		return err
	}
	fmt.Fprintf(e.stdout, "row %d of %s cancelled\n", id, t.Name)
	return nil
}
