package rowactor

import (
	"context"
	"strings"
	"testing"
)

func TestRedactHidesPasswords(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"postgres://app:s3cret@db:5432/x":                     "postgres://app:xxxxx@db:5432/x",
		"mysql://root:pw@tcp(127.0.0.1:3306)/x":               "mysql://root:xxxxx@tcp(127.0.0.1:3306)/x",
		"postgres://app@db/x":                                 "postgres://app@db/x",
		"sqlite:/tmp/a.db":                                    "sqlite:/tmp/a.db",
		"postgres://app@db/x?password=s3cret&sslmode=disable": "postgres://app@db/x?password=xxxxx&sslmode=disable",
		"postgres:host=db password=s3cret sslpassword=k":      "postgres:host=db password=xxxxx sslpassword=xxxxx",
	}
	for in, want := range cases {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenRefusesUnknownSchemesAndEmptyPaths(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"oracle://x", "sqlite:", "nothing"} {
		if _, err := Open(context.Background(), url); err == nil || !strings.Contains(err.Error(), "rowactor: Open") {
			t.Errorf("Open(%q) = %v, want a clear refusal", url, err)
		}
	}
}
