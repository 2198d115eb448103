package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// offlineDialects render schemas without a database: each dialect's Schema reads only
// the description, so its zero value serves (each dialect's TestZeroDialectSchema keeps
// that so). The names are rowactor.Open's schemes.
var offlineDialects = []struct {
	name string
	d    dialects.Dialect
}{
	{"postgres", &postgres.Dialect{}},
	{"mysql", &mysql.Dialect{}},
	{"sqlite", &sqlite.Dialect{}},
}

func offlineNames() string {
	names := make([]string, len(offlineDialects))
	for i, o := range offlineDialects {
		names[i] = o.name
	}
	return strings.Join(names, ", ")
}

var schemaCommand = &command{
	name:    "schema",
	summary: "print the CREATE TABLE and claim index of a table description",
	help: `Usage: rowactor schema -db postgres|mysql|sqlite [column flags] TABLE

Prints the CREATE TABLE statement and the recommended claim index that rowactor.Schema
renders for the description, in the database's column types. No database is needed:
nothing is connected to, nothing is created. Pipe it to psql, mysql or sqlite3.

Examples:
  rowactor schema -db sqlite -group queue -attempt attempt -retry-after retry_after \
      -locked-until locked_until -headers headers jobs
  rowactor schema -db postgres -group queue -attempt attempt -processed-at processed_at jobs | psql app
  rowactor schema -db mysql -advisory-key 'jobs-{id}' -attempt attempt jobs
`,
}

func init() { schemaCommand.run = runSchema }

func runSchema(_ context.Context, e *env, args []string) error {
	fs := newFlags(schemaCommand)
	db := fs.String("db", "", "the database whose column types to use: "+offlineNames()+" (required)")
	var t rowactor.Table
	addTableFlags(fs, &t)
	rest, err := parse(e, schemaCommand, fs, args)
	if err != nil {
		return err
	}
	if *db == "" {
		return usagef("-db is required: one of %s", offlineNames())
	}
	var d dialects.Dialect
	for _, o := range offlineDialects {
		if o.name == *db {
			d = o.d
		}
	}
	if d == nil {
		return usagef("-db %q: unknown database; use one of %s", *db, offlineNames())
	}
	if err := tableArg(rest, &t); err != nil {
		return err
	}
	ddl, err := rowactor.Schema(d, t)
	if err != nil {
		// The description alone is at fault: no database was asked.
		var ce *dialects.ConfigError
		if errors.As(err, &ce) {
			return &usageError{msg: describe(err)}
		}
		return err
	}
	fmt.Fprint(e.stdout, ddl)
	return nil
}
