// Command rowactor is the operator's command line for rowactor's queue tables.
//
//	rowactor schema -db sqlite -group queue -attempt attempt -locked-until locked_until jobs
//	rowactor stats -dsn sqlite:jobs.db -group queue -locked-until locked_until jobs
//	rowactor requeue -dsn "$DATABASE_URL" -group queue -from-group emails-dead -to-group emails jobs
//	rowactor bench -db sqlite -form lease -rows 20000
//
// The database is named by -dsn or DATABASE_URL in the forms rowactor.Open takes. The table
// is described by one flag per field of rowactor.Table, and checked against the live table
// before anything is read or written, so a wrong column is refused with the library's
// *ConfigError. Whatever differs between databases (the SQL, quoting, placeholders, how
// times are stored) lives in the dialects, behind dialects.Admin: this command asks the
// dialect and never switches on the database's name.
//
// Exit status: 0 done, 1 the database failed or refused (or requeue found no rows in its
// -from-group), 2 the command line is wrong.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rowactor/rowactor/dialects"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailed  = 1 // the database failed or refused, or the command it ran did
	exitUsage   = 2 // the command line is wrong
	programName = "rowactor"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// env is what a command writes to and reads from outside its flags.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// command is one of rowactor's commands.
type command struct {
	name    string
	summary string
	// help is the text -h prints: usage, description and examples; the flags follow it
	// (bench's are the harness's own).
	help string
	// run runs the command on its arguments, flags included. It returns errHelpShown
	// after -h, a *usageError for a command line that cannot run, and any other error
	// for a failure.
	run func(ctx context.Context, e *env, args []string) error
}

// commands are rowactor's commands, in the order help lists them.
var commands []*command

func init() {
	commands = []*command{schemaCommand, statsCommand, inspectCommand, retryCommand, cancelCommand, requeueCommand, serveCommand, benchCommand}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// run runs rowactor with args (without the program's name) and returns the exit status.
// SIGINT and SIGTERM end the command's context: a requeue in progress rolls back.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{stdout: stdout, stderr: stderr, getenv: os.Getenv}
	if len(args) == 0 {
		fmt.Fprint(stderr, mainHelp())
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		fmt.Fprint(stdout, mainHelp())
		return exitOK
	case "help":
		return help(e, rest)
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(stderr, "%s: unknown command %q\nRun '%s help' for the commands.\n", programName, name, programName)
		return exitUsage
	}
	return report(e, c, c.run(ctx, e, rest))
}

// help prints the main help, or a command's.
func help(e *env, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.stdout, mainHelp())
		return exitOK
	}
	c := lookup(args[0])
	if c == nil {
		fmt.Fprintf(e.stderr, "%s help: unknown command %q\nRun '%s help' for the commands.\n", programName, args[0], programName)
		return exitUsage
	}
	return report(e, c, c.run(context.Background(), e, []string{"-h"}))
}

// report turns a command's error into its message and exit status.
func report(e *env, c *command, err error) int {
	var (
		u  *usageError
		x  *exitStatus
		ce *dialects.ConfigError
	)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelpShown):
		return exitOK
	case errors.As(err, &x):
		return x.code
	case errors.As(err, &u):
		fmt.Fprintf(e.stderr, "%s %s: %s\nRun '%s %s -h' for help.\n", programName, c.name, u.msg, programName, c.name)
		return exitUsage
	}
	fmt.Fprintf(e.stderr, "%s %s: %v\n", programName, c.name, err)
	if errors.As(err, &ce) {
		if f := flagOf(ce.Option); f != "" && ce.Column != "" {
			fmt.Fprintf(e.stderr, "(-%s names the column %q)\n", f, ce.Column)
		}
	}
	return exitFailed
}

// usageError is a command line that cannot run: exit status 2.
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usagef(format string, a ...any) error { return &usageError{msg: fmt.Sprintf(format, a...)} }

// exitStatus ends rowactor with a status already explained (bench's child's own).
type exitStatus struct{ code int }

func (x *exitStatus) Error() string { return fmt.Sprintf("exit status %d", x.code) }

// mainHelp is rowactor's help, with each command's summary.
func mainHelp() string {
	var list strings.Builder
	for _, c := range commands {
		fmt.Fprintf(&list, "  %-9s %s\n", c.name, c.summary)
	}
	return fmt.Sprintf(mainHelpFormat, list.String())
}

// errHelpShown is -h: the help went to stdout, and the command did nothing else.
var errHelpShown = errors.New("help shown")

const mainHelpFormat = `rowactor is the operator's command line for rowactor's queue tables.

Usage:
  rowactor <command> [flags] [arguments]

Commands:
%s  help      print a command's help: rowactor help <command>

The database (stats, requeue) is -dsn URL, or the DATABASE_URL environment variable, in
the forms rowactor.Open takes:
  sqlite:PATH                                  (or a bare PATH ending in .db, .sqlite or
                                               .sqlite3, or file:PATH)
  postgres://user@host:5432/db?sslmode=disable
  mysql://user:pass@host:3306/db               (or mariadb://; %%-encode the password's
                                               '/', '?', '#' and '%%')
  mysql://user:pass@tcp(host:3306)/db          (or the bare DSN: user:pass@tcp(host:3306)/db)

The table is described by one flag per field of rowactor.Table; a flag left out names no
column: -id (default id), -payload (default payload), -group, -attempt, -retry-after,
-processed-at, -locked-until, -advisory-key, -headers. The description is checked
against the live table before anything is read or written.

Exit status: 0 done; 1 the database failed or refused (unreachable, a column the table
lacks, a requeue -from-group with no rows, ...); 2 the command line is wrong.

Examples:
  rowactor schema -db postgres -group queue -attempt attempt -locked-until locked_until jobs
  rowactor stats -dsn sqlite:jobs.db -group queue -locked-until locked_until jobs
  rowactor requeue -group queue -from-group emails-dead -to-group emails jobs
`
