package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/dsn"
)

// newFlags makes a command's flag set. Flags may come before or after the arguments
// (parse); -h and --help print the command's help and its flags to stdout.
func newFlags(c *command) *flag.FlagSet {
	fs := flag.NewFlagSet(programName+" "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse parses args into fs, flags interleaved with arguments (the flag package alone
// stops at the first argument), and returns the arguments. After "--" everything is an
// argument. -h prints c's help and returns errHelpShown; a bad flag is a usage error.
func parse(e *env, c *command, fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			printHelp(e, c, fs)
			return nil, errHelpShown
		}
		if err != nil {
			return nil, usagef("%v", err)
		}
		rest := fs.Args()
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// printHelp prints c's help, then its flags.
func printHelp(e *env, c *command, fs *flag.FlagSet) {
	fmt.Fprint(e.stdout, c.help)
	fmt.Fprintln(e.stdout, "\nFlags:")
	fs.SetOutput(e.stdout)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// tableFlags are the flags of rowactor.Table's column fields, by flag name.
var tableFlags = []struct {
	flag, option, def, usage string
	field                    func(t *rowactor.Table) *string
}{
	{"id", "Table.ID", "id", "the integer primary key column", func(t *rowactor.Table) *string { return &t.ID }},
	{"payload", "Table.Payload", "payload", "the payload column", func(t *rowactor.Table) *string { return &t.Payload }},
	{"group", "Table.Group", "", "the group column (several queues in one table)", func(t *rowactor.Table) *string { return &t.Group }},
	{"attempt", "Table.Attempt", "", "the attempt counter column", func(t *rowactor.Table) *string { return &t.Attempt }},
	{"retry-after", "Table.RetryAfter", "", "the not-before time column (delayed rows)", func(t *rowactor.Table) *string { return &t.RetryAfter }},
	{"processed-at", "Table.ProcessedAt", "", "the processed time column (rows kept after Ack)", func(t *rowactor.Table) *string { return &t.ProcessedAt }},
	{"locked-until", "Table.LockedUntil", "", "the lease expiry column (the lease form)", func(t *rowactor.Table) *string { return &t.LockedUntil }},
	{"advisory-key", "Table.AdvisoryKey", "", "the advisory key template, e.g. jobs-{id} (the advisory lock form)", func(t *rowactor.Table) *string { return &t.AdvisoryKey }},
	{"headers", "Table.Headers", "", "the headers column (a JSON object)", func(t *rowactor.Table) *string { return &t.Headers }},
	{"error", "Table.Error", "", "the last error column (the text of a handler's Fail)", func(t *rowactor.Table) *string { return &t.Error }},
	{"unique-key", "Table.UniqueKey", "", "the unique key column (rowactor.Unique publishes)", func(t *rowactor.Table) *string { return &t.UniqueKey }},
	{"priority", "Table.Priority", "", "the priority column (claims take lower numbers first)", func(t *rowactor.Table) *string { return &t.Priority }},
	{"dead-at", "Table.DeadAt", "", "the time-of-death column (a dead-letter move sets it, a requeue clears it)", func(t *rowactor.Table) *string { return &t.DeadAt }},
	{"cancel-requests", "Table.CancelRequests", "", "the cancel-request table (cancel reaches rows in work in other processes)", func(t *rowactor.Table) *string { return &t.CancelRequests }},
}

// addTableFlags binds the column flags to t's fields.
func addTableFlags(fs *flag.FlagSet, t *rowactor.Table) {
	for _, f := range tableFlags {
		fs.StringVar(f.field(t), f.flag, f.def, f.usage)
	}
}

// flagOf names the flag of a ConfigError's option ("Table.Group" is -group); "" for
// options no flag sets.
func flagOf(option string) string {
	for _, f := range tableFlags {
		if f.option == option {
			return f.flag
		}
	}
	return ""
}

// tableArg reads the one TABLE argument into t and checks the description as no database
// is needed to: a description that no database could serve is a usage error.
func tableArg(args []string, t *rowactor.Table) error {
	switch len(args) {
	case 0:
		return usagef("no TABLE given")
	case 1:
	default:
		return usagef("one TABLE expected, got %d arguments: %s", len(args), strings.Join(args, " "))
	}
	t.Name = args[0]
	if err := dialects.CheckDescription(*t); err != nil {
		return &usageError{msg: describe(err)}
	}
	return nil
}

// describe is a ConfigError's text with the flag it came from.
func describe(err error) string {
	var ce *dialects.ConfigError
	if errors.As(err, &ce) {
		if f := flagOf(ce.Option); f != "" {
			return fmt.Sprintf("%v (flag -%s)", err, f)
		}
	}
	return err.Error()
}

// dsnFlag adds -dsn.
func dsnFlag(fs *flag.FlagSet) *string {
	return fs.String("dsn", "", "the database, as rowactor.Open takes it: sqlite:PATH (or a PATH ending in .db/.sqlite/.sqlite3), "+
		"postgres://..., mysql://user:pass@host:3306/db, or mysql://DSN (or a bare user@tcp(host:port)/db DSN) (default $DATABASE_URL)")
}

// resolveDSN picks -dsn or DATABASE_URL. It reads it as rowactor.Open does (internal/dsn,
// one reader for both) only to find a SQLite file, which must exist: rowactor.Open would
// create an empty one, and an operator's typo should not leave a database behind. A name
// Open cannot read goes on to Open, whose error says which prefix to add and hides any
// password.
func resolveDSN(e *env, flagValue string) (string, error) {
	name := flagValue
	if name == "" {
		name = e.getenv("DATABASE_URL")
	}
	if name == "" {
		return "", usagef("no database: give -dsn URL or set DATABASE_URL (sqlite:PATH, postgres://..., mysql://user@host:3306/db or mysql://DSN)")
	}
	if t, err := dsn.Parse(name); err == nil && t.Kind == dsn.SQLite {
		if _, err := os.Stat(t.Addr); err != nil {
			return "", fmt.Errorf("the SQLite database %s: %w", t.Addr, err)
		}
	}
	return name, nil
}

// openTimeout bounds connecting to the database, not the command.
const openTimeout = 30 * time.Second

// openAdmin opens the database and finds its operator's commands (openBroker).
func openAdmin(ctx context.Context, dsn string) (dialects.Admin, func(), error) {
	b, closeFn, err := openBroker(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	a, ok := b.Dialect().(dialects.Admin)
	if !ok {
		closeFn()
		return nil, nil, fmt.Errorf("the %s dialect serves no operator's commands (dialects.Admin)", b.Dialect().Name())
	}
	return a, closeFn, nil
}

// openBroker opens the database with the library's broker, polling only (no LISTEN
// connection): close shuts it down and closes the database.
func openBroker(ctx context.Context, dsn string) (*rowactor.Broker, func(), error) {
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	b, err := rowactor.Open(octx, dsn, rowactor.WithPollOnly())
	if err != nil {
		return nil, nil, err
	}
	return b, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = b.Shutdown(sctx)
	}, nil
}

// openRow parses the command line of a command on one row (TABLE ID, the table's flags
// already on fs) and opens the database.
func openRow(ctx context.Context, e *env, c *command, fs *flag.FlagSet, args []string, dsnValue *string, t *rowactor.Table) (*rowactor.Broker, int64, func(), error) {
	rest, err := parse(e, c, fs, args)
	if err != nil {
		return nil, 0, nil, err
	}
	if len(rest) != 2 {
		return nil, 0, nil, usagef("TABLE and ID expected, got %d arguments", len(rest))
	}
	id, err := strconv.ParseInt(rest[1], 10, 64)
	if err != nil || id <= 0 {
		return nil, 0, nil, usagef("ID %q is not a row id (a positive integer)", rest[1])
	}
	if err := tableArg(rest[:1], t); err != nil {
		return nil, 0, nil, err
	}
	dsn, err := resolveDSN(e, *dsnValue)
	if err != nil {
		return nil, 0, nil, err
	}
	b, closeDB, err := openBroker(ctx, dsn)
	if err != nil {
		return nil, 0, nil, err
	}
	return b, id, closeDB, nil
}
