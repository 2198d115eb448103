package dsn

import (
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
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
		{"\n:pw@tcp(db)/app", MySQL, "\n:pw@tcp(db)/app", "mysql://\n:pw@tcp(db)/app"},
		// A user named postgres in a bare DSN: not a postgres:// URL.
		{"postgres:pw@tcp(db:3306)/app", MySQL, "postgres:pw@tcp(db:3306)/app", "mysql://postgres:pw@tcp(db:3306)/app"},
		// ... nor is one named mariadb a mariadb:// URL.
		{"mariadb:pw@tcp(db:3306)/app", MySQL, "mariadb:pw@tcp(db:3306)/app", "mysql://mariadb:pw@tcp(db:3306)/app"},
		// The driver's DSN after mysql:// or mariadb://, as it is: its protocol, or none.
		{"mariadb://root@tcp(db:3306)/app", MySQL, "root@tcp(db:3306)/app", "mysql://root@tcp(db:3306)/app"},
		{"mysql://root@/app", MySQL, "root@/app", "mysql://root@/app"},
		{"mysql:///app", MySQL, "/app", "mysql:///app"},
		{"mysql://root@tcp/app", MySQL, "root@tcp/app", "mysql://root@tcp/app"},
		{"mysql://u:p@ss/w:rd@tcp(db:3306)/app", MySQL, "u:p@ss/w:rd@tcp(db:3306)/app", "mysql://u:p@ss/w:rd@tcp(db:3306)/app"},
		// A URL: the driver's DSN, the URL kept as given under mysql://.
		{"mysql://root@127.0.0.1:3306/test", MySQL, "root@tcp(127.0.0.1:3306)/test", "mysql://root@127.0.0.1:3306/test"},
		{"mariadb://root@db/app", MySQL, "root@tcp(db:3306)/app", "mysql://root@db/app"},
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
		{"mysql://root:" + secret + "@db:port/app", "write '@', ':', '/'"},
		{"mysql://root:pa/" + secret + "@db:3306/app", "%2F"},
		{"mysql://root:pa?" + secret + "@db:3306/app", "%3F"},
		{"mysql://root:pa#" + secret + "@db:3306/app", "%23"},
		{"mysql://root:100%" + secret + "@db:3306/app", "%25"},
		{"mysql://ro%3Aot:" + secret + "@db:3306/app", "user name holds a ':'"},
		{"mysql://root:" + secret + "@db:3306/app/more", "more than a database name"},
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

// TestParseMySQLURL: a mysql:// URL, as DATABASE_URL holds it, becomes a DSN the driver
// reads back as the URL meant it: the user and password %-decoded (whatever characters
// they hold), port 3306 when none is named, IPv6 hosts, the database, and the query as
// the driver's parameters.
func TestParseMySQLURL(t *testing.T) {
	const odd = "p@ss:w/rd?#%(x)&=é "
	for _, c := range []struct {
		name, user, password, addr, db string
		params                         map[string]string
	}{
		{"mysql://root@127.0.0.1:3306/test", "root", "", "127.0.0.1:3306", "test", nil},
		{"mysql://db.example/app", "", "", "db.example:3306", "app", nil},
		{"mysql://app:s3cret@db.example/app", "app", "s3cret", "db.example:3306", "app", nil},
		{"mysql://app:a+b@db/app", "app", "a+b", "db:3306", "app", nil}, // '+' is no space in a userinfo
		{"mysql://app:" + url.PathEscape(odd) + "@db:3307/app", "app", odd, "db:3307", "app", nil},
		{"mysql://ap%40p:pw@db/app", "ap@p", "pw", "db:3306", "app", nil},
		{"mysql://app:@db/app", "app", "", "db:3306", "app", nil},
		{"mysql://root@[::1]:3306/test", "root", "", "[::1]:3306", "test", nil},
		{"mysql://root@[::1]/test", "root", "", "[::1]:3306", "test", nil},
		{"mysql://root@:3307/test", "root", "", "127.0.0.1:3307", "test", nil},
		{"mysql://root@db/my%20app", "root", "", "db:3306", "my app", nil},
		{"mysql://root@db:3306", "root", "", "db:3306", "", nil},
		{"mariadb://root@db:3306/app?tls=skip-verify&timeout=5s&loc=Europe/Paris&x_var=a%2Fb",
			"root", "", "db:3306", "app", map[string]string{"x_var": "a/b"}},
	} {
		target, err := Parse(c.name)
		if err != nil || target.Kind != MySQL {
			t.Errorf("Parse(%q) = %+v, %v; want a MySQL target", c.name, target, err)
			continue
		}
		if again, err := Parse(target.URL); err != nil || again != target {
			t.Errorf("Parse(%q) = %+v, %v; want %+v again", target.URL, again, err, target)
		}
		cfg, err := mysql.ParseDSN(target.Addr)
		if err != nil {
			t.Errorf("Parse(%q): the driver does not read DSN %q: %v", c.name, target.Addr, err)
			continue
		}
		if cfg.User != c.user || cfg.Passwd != c.password || cfg.Net != "tcp" || cfg.Addr != c.addr || cfg.DBName != c.db {
			t.Errorf("Parse(%q): DSN %q reads as user %q password %q %s(%s) db %q; want user %q password %q tcp(%s) db %q",
				c.name, target.Addr, cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName, c.user, c.password, c.addr, c.db)
		}
		for k, v := range c.params {
			if cfg.Params[k] != v {
				t.Errorf("Parse(%q): DSN %q has parameter %s=%q, want %q", c.name, target.Addr, k, cfg.Params[k], v)
			}
		}
		if strings.Contains(c.name, "?") && (cfg.TLSConfig != "skip-verify" || cfg.Timeout.String() != "5s" || cfg.Loc.String() != "Europe/Paris") {
			t.Errorf("Parse(%q): DSN %q reads as tls %q, timeout %v, loc %v", c.name, target.Addr, cfg.TLSConfig, cfg.Timeout, cfg.Loc)
		}
	}
}
