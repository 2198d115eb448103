package rowactor_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// TestOpenBareNames: Open takes a bare MySQL DSN and a bare SQLite path as the rowactor
// command does (one reader serves both): the DSN reaches the server and pings; each path
// form creates its file and serves a queue. A bare name it cannot read says which prefix
// to add.
func TestOpenBareNames(t *testing.T) {
	// Not parallel: the SQLite case changes the working directory (t.Chdir).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(t *testing.T, name string) *rowactor.Broker {
		t.Helper()
		b, err := rowactor.Open(ctx, name)
		if err != nil {
			t.Fatalf("Open(%q): %v", name, err)
		}
		t.Cleanup(func() {
			if _, err := b.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		})
		return b
	}

	t.Run("mysql", func(t *testing.T) {
		name := mysqlDSN() // root@tcp(127.0.0.1:3306)/test?parseTime=true, no mysql:// prefix
		if strings.Contains(name, "://") {
			t.Fatalf("ROWACTOR_MYSQL_DSN %q is not a bare DSN", name)
		}
		b := open(t, name)
		d, ok := b.Dialect().(*mysql.Dialect)
		if !ok {
			t.Fatalf("Open(%q) opened a %s dialect, want mysql", name, b.Dialect().Name())
		}
		if err := d.DB().PingContext(ctx); err != nil {
			t.Fatalf("ping: %v", err)
		}
	})

	t.Run("sqlite", func(t *testing.T) {
		dir := t.TempDir()
		t.Chdir(dir)
		for _, c := range []struct{ name, file string }{
			{"./jobs.db", "jobs.db"},
			{filepath.Join(dir, "abs.sqlite"), "abs.sqlite"},
			{"file:uri.db", "uri.db"},
			{"file://" + filepath.Join(dir, "uri-abs.sqlite3"), "uri-abs.sqlite3"},
		} {
			t.Run(c.file, func(t *testing.T) {
				b := open(t, c.name)
				if _, ok := b.Dialect().(*sqlite.Dialect); !ok {
					t.Fatalf("Open(%q) opened a %s dialect, want sqlite", c.name, b.Dialect().Name())
				}
				if _, err := os.Stat(filepath.Join(dir, c.file)); err != nil {
					t.Fatalf("Open(%q) made no file %s: %v", c.name, c.file, err)
				}
				tb := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", LockedUntil: "locked_until"}
				ddl, err := rowactor.Schema(b.Dialect(), tb)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := b.Dialect().(*sqlite.Dialect).DB().ExecContext(ctx, ddl); err != nil {
					t.Fatal(err)
				}
				if _, err := b.Publish(ctx, tb, "q", []byte("x")); err != nil {
					t.Fatalf("Publish into %s: %v", c.name, err)
				}
			})
		}
	})

	t.Run("refused", func(t *testing.T) {
		dir := t.TempDir()
		t.Chdir(dir)
		for _, c := range []struct{ name, want string }{
			{"jobs", "sqlite:PATH"},
			{"/var/lib/queue", "sqlite:PATH"},
			{"file:jobs.db?mode=ro", "use sqlite:PATH"},
		} {
			b, err := rowactor.Open(ctx, c.name)
			if b != nil {
				_, _ = b.Shutdown(ctx)
				t.Fatalf("Open(%q) returned a broker", c.name)
			}
			if err == nil || !strings.HasPrefix(err.Error(), "rowactor: Open(") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Open(%q): %v, want a refusal naming %q", c.name, err, c.want)
			}
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("refused names left files behind: %v", left)
		}
	})
}

// TestOpenMySQLURL: Open takes a MySQL URL as DATABASE_URL holds it,
// mysql://user@host:3306/db (by default mysql://root@127.0.0.1:3306/test, made from
// ROWACTOR_MYSQL_DSN), not only the driver's DSN: a broker opened by it publishes a row
// and consumes it, and the row is gone from the table.
func TestOpenMySQLURL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := gomysql.ParseDSN(mysqlDSN())
	if err != nil || cfg.Net != "tcp" {
		t.Fatalf("ROWACTOR_MYSQL_DSN is no tcp DSN to make a URL of (%v)", err)
	}
	user := url.User(cfg.User)
	if cfg.Passwd != "" {
		user = url.UserPassword(cfg.User, cfg.Passwd)
	}
	name := (&url.URL{Scheme: "mysql", User: user, Host: cfg.Addr, Path: "/" + cfg.DBName}).String()
	settled := make(chan rowactor.Settlement, 1)
	b, err := rowactor.Open(ctx, name, rowactor.WithOnSettled(func(s rowactor.Settlement) { settled <- s }))
	if err != nil {
		t.Fatalf("Open(%q): %v", name, err)
	}
	d, ok := b.Dialect().(*mysql.Dialect)
	if !ok {
		t.Fatalf("Open(%q) opened a %s dialect, want mysql", name, b.Dialect().Name())
	}
	tb := rowactor.Table{Name: fmt.Sprintf("ra_open_url_%d", time.Now().UnixNano()%1e9), ID: "id", Payload: "payload",
		Attempt: "attempt", LockedUntil: "locked_until"}
	defer func() {
		// The table goes after Shutdown, which closed the broker's pool: on a pool of its own.
		if _, err := b.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		own, err := mysql.Open(context.Background(), mysqlDSN())
		if err != nil {
			t.Errorf("drop %s: %v", tb.Name, err)
			return
		}
		defer own.Close()
		if _, err := own.DB().ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb.Name); err != nil {
			t.Errorf("drop %s: %v", tb.Name, err)
		}
	}()
	ddl, err := rowactor.Schema(d, tb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.DB().ExecContext(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	id, err := b.Publish(ctx, tb, "q", []byte("over a URL"))
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	payloads := make(chan []byte, 1)
	if _, err := b.Subscribe(ctx, tb, "q", func(_ context.Context, del *rowactor.Delivery) rowactor.Outcome {
		payloads <- del.Payload()
		return rowactor.Ack()
	}); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	select {
	case s := <-settled:
		if got := <-payloads; s.Err != nil || s.Step != "ack" || string(got) != "over a URL" {
			t.Fatalf("settlement %+v of payload %q", s, got)
		}
	case <-ctx.Done():
		t.Fatal("the row published over the URL was not consumed")
	}
	var n int
	if err := d.DB().QueryRowContext(ctx, "SELECT count(*) FROM "+tb.Name+" WHERE id = ?", id).Scan(&n); err != nil || n != 0 {
		t.Fatalf("row %d after its ack: %d rows, %v", id, n, err)
	}
}
