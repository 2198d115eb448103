package dashboard_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dashboard"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// A service mounts the dashboard of its queue table on its own mux, under a prefix.
func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "dashboard-")
	defer os.RemoveAll(dir)
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(ctx)
	emails := rowactor.Table{Name: "email_jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", RetryAfter: "retry_after", ProcessedAt: "processed_at",
		LockedUntil: "locked_until", Headers: "headers", Error: "error"}
	ddl, _ := rowactor.Schema(b.Dialect(), emails)
	if _, err := b.Dialect().(*sqlite.Dialect).DB().ExecContext(ctx, ddl); err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()

	// snippet mount: begin
	// DeadLetters names each queue's dead-letter group: the overview counts it, and
	// "requeue dead letters" moves its rows back. ReadOnly() would turn every action off.
	d, err := dashboard.New(b, []dashboard.Table{{Table: emails,
		DeadLetters: map[string]string{"emails": "emails-dead"}}},
		dashboard.TraceURL("http://jaeger:16686/trace/{trace_id}"))
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("/admin/queues/", http.StripPrefix("/admin/queues", d))
	// snippet mount: end

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/queues/", nil))
	fmt.Println(rec.Code)

	// Output:
	// 200
}
