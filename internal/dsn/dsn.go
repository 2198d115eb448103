// Package dsn reads the database names rowactor.Open and the rowactor command take, so
// that both take the same ones:
//
//	sqlite:PATH, sqlite://PATH         a SQLite file (sqlite3: too)
//	PATH ending in .db, .sqlite, .sqlite3   the same, bare: ./jobs.db, /tmp/x.db
//	file:PATH, file:///PATH            the same, as a file URI without parameters
//	postgres://..., postgresql://...   a PostgreSQL URL
//	mysql://user:pass@host:3306/db?... a MySQL URL, as DATABASE_URL holds it (mariadb:// too)
//	mysql://DSN, mysql:DSN             a go-sql-driver/mysql DSN
//	user:pass@tcp(host:3306)/db?...    the same, bare (tcp, tcp4, tcp6 or unix)
//
// After mysql:// (or mariadb://), a name is the driver's DSN when what precedes its
// database is a protocol, tcp(host:port), unix(/path) or a bare tcp, tcp4, tcp6 or unix,
// or nothing (user@/db); anything else, such as host:3306 or [::1]:3306, is a URL. A URL
// is turned into the driver's DSN: its user and password %-decoded, its port 3306 when it
// names none, its query passed on as the driver's parameters.
//
// A bare MySQL DSN whose user is named like a scheme (mysql, sqlite, sqlite3, file) reads
// as that scheme: give it the mysql:// prefix.
package dsn

import (
	"errors"
	"fmt"
	"net"
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
	// URL is the name in its canonical form: sqlite:PATH, the postgres URL, mysql://DSN,
	// or a MySQL URL as given, with the scheme mysql://. Parse reads it back as the same
	// Target.
	URL string
}

// SQLiteSuffixes are the file name endings a bare SQLite path is recognised by.
var SQLiteSuffixes = []string{".db", ".sqlite", ".sqlite3"}

// bareMySQL matches a go-sql-driver DSN with a protocol and no scheme:
// [user[:password]@]tcp[(address)]/dbname[?params]. A user or password may hold any
// byte, a newline too.
var bareMySQL = regexp.MustCompile(`(?s)^(?:.*@)?(?:tcp|tcp4|tcp6|unix)(?:\([^)]*\))?/`)

// Forms names the forms a database is given in, for error messages.
const Forms = "sqlite:PATH (or a bare PATH ending in .db, .sqlite or .sqlite3), postgres://..., " +
	"mysql://user:pass@host:3306/db, or mysql://DSN (or a bare user@tcp(host:port)/db DSN)"

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
	case found && isMySQLScheme(scheme, rest):
		return mysqlTarget(rest)
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

// isMySQLScheme says a name's scheme is MySQL's: mysql: or mysql://, or mariadb:// (a bare
// DSN's user may be named mariadb, so mariadb: alone is no scheme).
func isMySQLScheme(scheme, rest string) bool {
	return scheme == "mysql" || scheme == "mariadb" && strings.HasPrefix(rest, "//")
}

// mysqlTarget reads what follows mysql: or mariadb:, "//" included: mysql:DSN, or after
// "//" the driver's DSN as it is or a URL turned into one.
func mysqlTarget(rest string) (Target, error) {
	rest, slashes := strings.CutPrefix(rest, "//")
	if !slashes || isDriverDSN(rest) {
		return Target{Kind: MySQL, Addr: rest, URL: "mysql://" + rest}, nil
	}
	addr, err := urlToDSN(rest)
	if err != nil {
		return Target{}, err
	}
	return Target{Kind: MySQL, Addr: addr, URL: "mysql://" + rest}, nil
}

// isDriverDSN says whether s is read by go-sql-driver/mysql as its DSN,
// [user[:password]@][protocol[(address)]]/db[?params], with a protocol it knows: the
// driver splits s at its last '/', and the part before that at its last '@' (a password
// may hold either); what lies between is the protocol and its address. A URL's host:port
// there would be taken for a protocol of that name, which the driver does not know.
func isDriverDSN(s string) bool {
	head := s
	if slash := strings.LastIndex(s, "/"); slash >= 0 {
		head = s[:slash]
	}
	proto := head[strings.LastIndex(head, "@")+1:]
	switch proto {
	case "", "tcp", "tcp4", "tcp6", "unix":
		return true
	}
	return strings.Contains(proto, "(")
}

// errBadMySQLURL is urlToDSN's error for a URL that does not parse. It quotes no part of
// the URL, which may hold a password.
var errBadMySQLURL = errors.New("a mysql:// URL that does not read as mysql://user:password@host:port/db?params: " +
	"write '@', ':', '/', '?', '#' and '%' in the user name and password %-encoded (%40, %3A, %2F, %3F, %23, %25)")

// urlToDSN turns a MySQL URL (after its scheme's "//") into the driver's DSN:
// user:password@tcp(host:port)/db?params. The password is written as it is, not escaped:
// the driver takes the userinfo up to the last '@' before the last '/', and the database
// name and parameters are escaped here so that they hold no '/'.
func urlToDSN(rest string) (string, error) {
	u, err := url.Parse("mysql://" + rest)
	if err != nil || u.Opaque != "" || u.Fragment != "" || strings.Contains(rest, "#") {
		return "", errBadMySQLURL // err quotes the URL
	}
	var b strings.Builder
	if u.User != nil {
		user := u.User.Username()
		if strings.Contains(user, ":") {
			return "", errors.New("a mysql:// URL whose user name holds a ':': the driver would take what follows for the password; " +
				"use a user without one")
		}
		b.WriteString(user)
		if password, ok := u.User.Password(); ok {
			b.WriteString(":" + password)
		}
		b.WriteString("@")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if strings.Contains(db, "/") {
		return "", errors.New("a mysql:// URL whose path is more than a database name: use mysql://user@host:3306/db")
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1" // the driver's default, as for mysql://user@/db
	}
	if port == "" {
		port = "3306"
	}
	b.WriteString("tcp(" + net.JoinHostPort(host, port) + ")/")
	b.WriteString(url.PathEscape(db))
	if u.RawQuery != "" {
		// The driver finds the database at the DSN's last '/', so none may follow it; it
		// %-decodes the parameters whose values may hold one.
		b.WriteString("?" + strings.ReplaceAll(u.RawQuery, "/", "%2F"))
	}
	return b.String(), nil
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
