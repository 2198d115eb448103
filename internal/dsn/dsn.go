// Package dsn reads the database names rowactor.Open and the rowactor command take, so
// that both take the same ones:
//
//	sqlite:PATH, sqlite://PATH         a SQLite file (sqlite3: too)
//	PATH ending in .db, .sqlite, .sqlite3   the same, bare: ./jobs.db, /tmp/x.db
//	file:PATH, file:///PATH            the same, as a file URI without parameters
//	postgres://..., postgresql://...   a PostgreSQL URL
//	mysql://DSN, mysql:DSN             a go-sql-driver/mysql DSN
//	user:pass@tcp(host:3306)/db?...    the same, bare (tcp, tcp4, tcp6 or unix)
//
// A bare MySQL DSN whose user is named like a scheme (mysql, sqlite, sqlite3, file) reads
// as that scheme: give it the mysql:// prefix.
package dsn

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// The kinds of database a name reaches, as rowactor.Open's schemes spell them.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
	MySQL    = "mysql"
)

// Target is the database a name reaches.
type Target struct {
	// Kind is SQLite, Postgres or MySQL.
	Kind string
	// Addr is what the kind's dialect opens: the file path, the URL, or the DSN.
	Addr string
	// URL is the name in its canonical form: sqlite:PATH, the postgres URL, mysql://DSN.
	URL string
}

// SQLiteSuffixes are the file name endings a bare SQLite path is recognised by.
var SQLiteSuffixes = []string{".db", ".sqlite", ".sqlite3"}

// bareMySQL matches a go-sql-driver DSN with a protocol and no scheme:
// [user[:password]@]tcp[(address)]/dbname[?params].
var bareMySQL = regexp.MustCompile(`^(?:.*@)?(?:tcp|tcp4|tcp6|unix)(?:\([^)]*\))?/`)

// Forms names the forms a database is given in, for error messages.
const Forms = "sqlite:PATH (or a bare PATH ending in .db, .sqlite or .sqlite3), postgres://..., or mysql://DSN (or a bare user@tcp(host:port)/db DSN)"

// Parse reads a database name. Its errors say which prefix to add; they quote no part of
// the name, which may hold a password.
func Parse(name string) (Target, error) {
	if name == "" {
		return Target{}, fmt.Errorf("no database named; use %s", Forms)
	}
	scheme, rest, found := strings.Cut(name, ":")
	switch {
	case found && (scheme == "sqlite" || scheme == "sqlite3"):
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return Target{}, errors.New("no file path; use sqlite:path/to/file.db")
		}
		return sqlite(path), nil
	case found && (scheme == "postgres" || scheme == "postgresql") && strings.HasPrefix(rest, "//"):
		return Target{Kind: Postgres, Addr: name, URL: name}, nil
	case found && scheme == "mysql":
		dsn := strings.TrimPrefix(rest, "//")
		return Target{Kind: MySQL, Addr: dsn, URL: "mysql://" + dsn}, nil
	case found && scheme == "file":
		return fileURI(rest)
	case bareMySQL.MatchString(name):
		return Target{Kind: MySQL, Addr: name, URL: "mysql://" + name}, nil
	case bare(scheme, found) && hasSQLiteSuffix(name):
		return sqlite(name), nil
	case found && (scheme == "postgres" || scheme == "postgresql"):
		return Target{}, fmt.Errorf("a PostgreSQL URL starts with %s://; use %s://user@host:5432/db", scheme, scheme)
	case bare(scheme, found):
		return Target{}, errors.New("no scheme, and not a SQLite file name (.db, .sqlite, .sqlite3) nor a MySQL DSN; " +
			"prefix it: sqlite:PATH for a SQLite file, postgres:// for PostgreSQL, mysql:// for a MySQL DSN")
	}
	if strings.Contains(name, "@") && !strings.Contains(name, "://") {
		// What precedes the ':' is likely a user name, and what follows a password.
		return Target{}, errors.New("not a name rowactor reads: a bare MySQL DSN needs its protocol and database, " +
			"user:pass@tcp(host:3306)/db; or prefix it: mysql://DSN, postgres://URL, sqlite:PATH")
	}
	return Target{}, fmt.Errorf("unknown scheme %q; use %s", scheme, Forms)
}

func sqlite(path string) Target { return Target{Kind: SQLite, Addr: path, URL: "sqlite:" + path} }

// bare says a name has no scheme: no ':' at all, or one after a path's '/', '\' or '.',
// or after a Windows drive letter.
func bare(scheme string, found bool) bool {
	return !found || strings.ContainsAny(scheme, `/\.`) || len(scheme) == 1
}

func hasSQLiteSuffix(name string) bool {
	lower := strings.ToLower(name)
	for _, s := range SQLiteSuffixes {
		if strings.HasSuffix(lower, s) {
			return true
		}
	}
	return false
}

// fileURI reads a SQLite file URI (after "file:"): file:x.db, file:/abs/x.db,
// file:///abs/x.db, file://localhost/abs/x.db, %-escapes decoded. Parameters are refused:
// rowactor sets its own (WAL, busy timeout, synchronous=NORMAL).
func fileURI(rest string) (Target, error) {
	if strings.ContainsAny(rest, "?#") {
		return Target{}, errors.New("a file: URI with parameters: rowactor.Open sets its own pragmas; " +
			"use sqlite:PATH, or open the *sql.DB yourself and use rowactor.New(sqlite.New(db))")
	}
	path := rest
	if after, ok := strings.CutPrefix(rest, "//"); ok {
		host, p, _ := strings.Cut(after, "/")
		if host != "" && host != "localhost" {
			return Target{}, fmt.Errorf("a file: URI names host %q; use a local path, sqlite:PATH", host)
		}
		path = "/" + p
	}
	dec, err := url.PathUnescape(path)
	if err != nil {
		return Target{}, fmt.Errorf("a file: URI with a bad %%-escape: %w", err)
	}
	if dec == "" || dec == "/" {
		return Target{}, errors.New("no file path; use sqlite:path/to/file.db")
	}
	return sqlite(dec), nil
}
