package main

import (
	"context"
	"os"
	"testing"

	"github.com/rowactor/rowactor/examples/internal/exampledb"
)

// TestEveryFormOnEveryDatabase runs the example as `go run ./examples/forms` would, on a
// SQLite file and on the test servers (ROWACTOR_POSTGRES_URL, ROWACTOR_MYSQL_DSN; the
// local servers by default). Like the rest of the suite it fails, never skips, when a
// server is missing.
func TestEveryFormOnEveryDatabase(t *testing.T) {
	urls := map[string]string{
		"sqlite":   "",
		"postgres": env("ROWACTOR_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"mysql":    env("ROWACTOR_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true"),
	}
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			db, cleanup, err := exampledb.Pick(url, workers+1)
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			forms := []string{"rowlock", "lease", "advisory"}
			if db.Name == "sqlite" {
				forms = forms[1:]
			}
			for _, f := range forms {
				if err := run(context.Background(), db, f); err != nil {
					t.Errorf("%s %s: %v", db.Name, f, err)
				}
			}
		})
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
