package dsn

import (
	"strings"
	"testing"
)

// TestParse: every name rowactor.Open and the rowactor command take, and the errors for
// the rest, which say which prefix to add and show no password.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		name, kind, addr, url string
	}{
		{"sqlite:jobs.db", SQLite, "jobs.db", "sqlite:jobs.db"},
		{"sqlite:///tmp/x.db", SQLite, "/tmp/x.db", "sqlite:/tmp/x.db"},
		{"sqlite3:queue", SQLite, "queue", "sqlite:queue"},
		{"./jobs.db", SQLite, "./jobs.db", "sqlite:./jobs.db"},
		{"/tmp/x.db", SQLite, "/tmp/x.db", "sqlite:/tmp/x.db"},
		{"jobs.SQLite3", SQLite, "jobs.SQLite3", "sqlite:jobs.SQLite3"},
		{`C:\data\jobs.db`, SQLite, `C:\data\jobs.db`, `sqlite:C:\data\jobs.db`},
		{"./a:b.db", SQLite, "./a:b.db", "sqlite:./a:b.db"},
		{"file:x.db", SQLite, "x.db", "sqlite:x.db"},
		{"file:/tmp/x.db", SQLite, "/tmp/x.db", "sqlite:/tmp/x.db"},
		{"file:///tmp/my%20x.db", SQLite, "/tmp/my x.db", "sqlite:/tmp/my x.db"},
		{"file://localhost/tmp/x.db", SQLite, "/tmp/x.db", "sqlite:/tmp/x.db"},
		{"postgres://app@db:5432/app", Postgres, "postgres://app@db:5432/app", "postgres://app@db:5432/app"},
		{"postgresql://app@db/app", Postgres, "postgresql://app@db/app", "postgresql://app@db/app"},
		{"mysql://root@tcp(db:3306)/app", MySQL, "root@tcp(db:3306)/app", "mysql://root@tcp(db:3306)/app"},
		{"mysql:root@tcp(db:3306)/app", MySQL, "root@tcp(db:3306)/app", "mysql://root@tcp(db:3306)/app"},
		{"root@tcp(127.0.0.1:3306)/test?parseTime=true", MySQL, "root@tcp(127.0.0.1:3306)/test?parseTime=true", "mysql://root@tcp(127.0.0.1:3306)/test?parseTime=true"},
		{"user@tcp(host)/db", MySQL, "user@tcp(host)/db", "mysql://user@tcp(host)/db"},
		{"app:p@ss:w/rd@tcp6([::1]:3306)/db", MySQL, "app:p@ss:w/rd@tcp6([::1]:3306)/db", "mysql://app:p@ss:w/rd@tcp6([::1]:3306)/db"},
		{"app@unix(/run/mysqld/mysqld.sock)/db", MySQL, "app@unix(/run/mysqld/mysqld.sock)/db", "mysql://app@unix(/run/mysqld/mysqld.sock)/db"},
		{"tcp(db)/app", MySQL, "tcp(db)/app", "mysql://tcp(db)/app"},
		// A user named postgres in a bare DSN: not a postgres:// URL.
		{"postgres:pw@tcp(db:3306)/app", MySQL, "postgres:pw@tcp(db:3306)/app", "mysql://postgres:pw@tcp(db:3306)/app"},
	} {
		got, err := Parse(c.name)
		if err != nil || got != (Target{Kind: c.kind, Addr: c.addr, URL: c.url}) {
			t.Errorf("Parse(%q) = %+v, %v; want %s %q %q", c.name, got, err, c.kind, c.addr, c.url)
		}
	}
	const secret = "s3cret"
	for _, c := range []struct{ name, want string }{
		{"", "no database named"},
		{"sqlite:", "no file path"},
		{"sqlite://", "no file path"},
		{"file:", "no file path"},
		{"file:x.db?mode=ro", "file: URI with parameters"},
		{"file://db.example/x.db", `names host "db.example"`},
		{"jobs", "prefix it: sqlite:PATH"},
		{"/var/lib/queue", "prefix it: sqlite:PATH"},
		{"postgres:host=db", "a PostgreSQL URL starts with postgres://"},
		{"oracle://scott:" + secret + "@db/orcl", `unknown scheme "oracle"`},
		{"localhost:5432", `unknown scheme "localhost"`},
		{"root@x:" + secret + "@tcp(db", "a bare MySQL DSN needs its protocol and database"},
		{"root:" + secret + "@tcp(127.0.0.1:1/test", "a bare MySQL DSN needs its protocol and database"},
	} {
		_, err := Parse(c.name)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q): %v, want an error with %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("Parse(%q): the error shows the password: %v", c.name, err)
		}
	}
}
