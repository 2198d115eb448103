package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheMailerMovesByItsURLAlone runs the one program on the three databases, changing
// nothing but the URL: a SQLite file, and the test servers as DATABASE_URL-style URLs
// (ROWACTOR_POSTGRES_URL, and ROWACTOR_MYSQL_DSN after mysql://; the local servers by
// default). Like the rest of the suite it fails, never skips, when a server is missing.
func TestTheMailerMovesByItsURLAlone(t *testing.T) {
	t.Parallel()
	mysqlURL := "mysql://root@127.0.0.1:3306/test"
	if dsn := os.Getenv("ROWACTOR_MYSQL_DSN"); dsn != "" {
		mysqlURL = "mysql://" + dsn
	}
	pgURL := "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	if u := os.Getenv("ROWACTOR_POSTGRES_URL"); u != "" {
		pgURL = u
	}
	urls := map[string]string{
		"sqlite":   "sqlite:" + filepath.Join(t.TempDir(), "mailer.db"),
		"postgres": pgURL,
		"mysql":    mysqlURL,
	}
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			summary, err := run(context.Background(), url)
			if err != nil {
				t.Fatalf("%s: %v", url, err)
			}
			if !strings.HasPrefix(summary, "mailer on "+name+":") {
				t.Fatalf("ran on the wrong database: %s", summary)
			}
			t.Log(summary)
		})
	}
}
