package rowactor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// TestOpenBareNames: Open takes a bare MySQL DSN and a bare SQLite path as the rowactor
// command does (one reader serves both): the DSN reaches the server and pings; each path
// form creates its file and serves a queue. A bare name it cannot read says which prefix
// to add.
func TestOpenBareNames(t *testing.T) {
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
