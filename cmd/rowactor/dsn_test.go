package main

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor"
)

// TestDSNFormsAgreeWithOpen: the command takes every name rowactor.Open takes (a bare
// MySQL DSN, a mysql:// URL, a bare SQLite path, a file: URI) and refuses what Open refuses, with Open's
// words; a SQLite file must exist for the command, never created by it.
func TestDSNFormsAgreeWithOpen(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	// A table on each database to read.
	lite := newFixture(t, databases[0])
	my := newFixture(t, databases[2])
	tables := map[*fixture]rowactor.Table{}
	for _, f := range []*fixture{lite, my} {
		tb := rowactor.Table{Name: f.tableName("ra_cli_"), ID: "id", Payload: "payload", LockedUntil: "locked_until"}
		f.create(tb)
		f.publish(tb, "", "x")
		tables[f] = tb
	}
	path := strings.TrimPrefix(lite.dsn, "sqlite:")
	dir := filepath.Dir(path)
	t.Chdir(dir)
	for _, c := range []struct {
		name string
		f    *fixture
	}{
		{mysqlDSN(), my},  // root@tcp(127.0.0.1:3306)/test?parseTime=true
		{mysqlURL(t), my}, // mysql://root@127.0.0.1:3306/test
		{path, lite},
		{"./" + filepath.Base(path), lite},
		{"file:" + path, lite},
		{"file://" + path, lite},
	} {
		tb := tables[c.f]
		code, out, errOut := cli(append([]string{"stats", "-dsn", c.name}, append(columnFlags(tb), tb.Name)...)...)
		if code != exitOK || !strings.HasPrefix(out, "DUE") {
			t.Errorf("stats -dsn %s: exit %d, stdout %q, stderr %q; want the table's stats", c.name, code, out, errOut)
		}
		b, err := rowactor.Open(ctx, c.name)
		if err != nil {
			t.Errorf("rowactor.Open(%q): %v; the command took it", c.name, err)
			continue
		}
		if _, err := b.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}

	for _, name := range []string{"jobs", "/var/lib/queue", "file:q.db?mode=ro", "localhost:5432"} {
		code, out, errOut := cli("stats", "-dsn", name, "jobs")
		_, err := rowactor.Open(ctx, name)
		if err == nil {
			t.Fatalf("rowactor.Open(%q) took it", name)
		}
		if code != exitFailed || out != "" || !strings.Contains(errOut, err.Error()) {
			t.Errorf("stats -dsn %s: exit %d, stdout %q, stderr %q; want 1 and Open's error %q", name, code, out, errOut, err)
		}
	}
	// A SQLite name in any form names a file that must exist.
	for _, name := range []string{"./typo.db", "file:typo.db", "sqlite:typo.db"} {
		code, _, errOut := cli("stats", "-dsn", name, "jobs")
		if code != exitFailed || !strings.Contains(errOut, "typo.db") {
			t.Errorf("stats -dsn %s: exit %d, stderr %q; want 1 and the file named", name, code, errOut)
		}
		if _, err := os.Stat(filepath.Join(dir, "typo.db")); !os.IsNotExist(err) {
			t.Fatalf("stats -dsn %s created the file: %v", name, err)
		}
	}
}

// mysqlURL is the test's MySQL server as a URL, mysql://user:pass@host:port/db.
func mysqlURL(t *testing.T) string {
	t.Helper()
	cfg, err := gomysql.ParseDSN(mysqlDSN())
	if err != nil || cfg.Net != "tcp" {
		t.Fatalf("ROWACTOR_MYSQL_DSN is no tcp DSN to make a URL of (%v)", err)
	}
	user := url.User(cfg.User)
	if cfg.Passwd != "" {
		user = url.UserPassword(cfg.User, cfg.Passwd)
	}
	return (&url.URL{Scheme: "mysql", User: user, Host: cfg.Addr, Path: "/" + cfg.DBName}).String()
}
