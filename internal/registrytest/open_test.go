// Package registrytest checks that rowactor links a database's driver only when the
// program imports that database's dialect. Its test binary imports the SQLite dialect
// alone, as a SQLite-only program does.
package registrytest_test

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite"
)

// TestOpenNamesTheMissingImport: Open of a PostgreSQL or MySQL name in a program that
// imports only the SQLite dialect fails at once, before any connection, with
// ErrDialectNotImported and the import line to add; the password stays hidden.
func TestOpenNamesTheMissingImport(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ url, kind string }{
		{"postgres://app:s3cret@127.0.0.1:5432/test?sslmode=disable", "postgres"},
		{"mysql://app:s3cret@tcp(127.0.0.1:3306)/test", "mysql"},
		{"app:s3cret@tcp(127.0.0.1:3306)/test", "mysql"},
	} {
		b, err := rowactor.Open(ctx, c.url)
		if err == nil {
			_, _ = b.Shutdown(ctx)
			t.Fatalf("Open(%q) without its dialect imported succeeded", c.url)
		}
		if !errors.Is(err, rowactor.ErrDialectNotImported) {
			t.Fatalf("Open(%q): %v, want ErrDialectNotImported", c.url, err)
		}
		want := `import _ "github.com/rowactor/rowactor/dialects/` + c.kind + `"`
		if !strings.Contains(strings.ReplaceAll(err.Error(), `\"`, `"`), want) {
			t.Fatalf("Open(%q): %q does not name %s", c.url, err, want)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("Open(%q): the error shows the password: %q", c.url, err)
		}
	}
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatalf("Open of the imported SQLite dialect: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
}

// TestDriversLinkedOnlyWhenImported: the root package depends on no database driver, and
// the SQLite quickstart links the SQLite driver alone.
func TestDriversLinkedOnlyWhenImported(t *testing.T) {
	drivers := map[string]string{
		"github.com/jackc/pgx/v5":                        "pgx",
		"github.com/go-sql-driver/mysql":                 "the MySQL driver",
		"modernc.org/sqlite":                             "the SQLite driver",
		"github.com/rowactor/rowactor/dialects/postgres": "the PostgreSQL dialect",
		"github.com/rowactor/rowactor/dialects/mysql":    "the MySQL dialect",
		"github.com/rowactor/rowactor/dialects/sqlite":   "the SQLite dialect",
	}
	deps := func(pkg string) map[string]bool {
		t.Helper()
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		got := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			for d := range drivers {
				if p == d || strings.HasPrefix(p, d+"/") {
					got[d] = true
				}
			}
		}
		return got
	}
	for d := range deps("github.com/rowactor/rowactor") {
		t.Errorf("the root package links %s (%s); only a program's import of a dialect may", drivers[d], d)
	}
	quick := deps("github.com/rowactor/rowactor/examples/quickstart")
	for _, d := range []string{"github.com/jackc/pgx/v5", "github.com/go-sql-driver/mysql",
		"github.com/rowactor/rowactor/dialects/postgres", "github.com/rowactor/rowactor/dialects/mysql"} {
		if quick[d] {
			t.Errorf("the SQLite quickstart links %s (%s)", drivers[d], d)
		}
	}
	if !quick["modernc.org/sqlite"] {
		t.Error("the SQLite quickstart does not link the SQLite driver: go list found nothing, so this test checks nothing")
	}
}
