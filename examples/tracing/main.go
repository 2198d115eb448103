// Tracing: the spans of one publish and its delivery, printed to stdout.
//
// A row is published inside a request's span and handled by a subscription; the trace
// shows the request, the producer span that wrote the row's traceparent into its headers
// column, the delivery's consumer span (its child), the handler's own span and the
// settlement. No collector needed:
//
//	go run ./examples/tracing
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/rowactor/rowactor"
	_ "github.com/rowactor/rowactor/dialects/sqlite" // importing a dialect registers it for rowactor.Open
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	exporter, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	// A syncer exports each span as it ends, so the output reads in order.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	defer tp.Shutdown(ctx)

	dir, err := os.MkdirTemp("", "rowactor-tracing-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"), rowactor.WithTracerProvider(tp))
	if err != nil {
		return err
	}
	// The headers column carries the publisher's traceparent to the consumer.
	jobs := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
		Attempt: "attempt", LockedUntil: "locked_until", Headers: "headers"}
	if err := b.ApplySchema(ctx, jobs); err != nil {
		return err
	}

	done := make(chan struct{})
	if _, err := b.Subscribe(ctx, jobs, "emails", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		// The handler's context carries the delivery span: the service's spans nest under it.
		_, span := tp.Tracer("example").Start(ctx, "send email")
		span.End()
		close(done)
		return rowactor.Ack()
	}); err != nil {
		return err
	}

	reqCtx, request := tp.Tracer("example").Start(ctx, "POST /signup")
	if _, err := b.Publish(reqCtx, jobs, "emails", []byte("welcome@example.com")); err != nil {
		return err
	}
	request.End()
	<-done
	_, err = b.Shutdown(ctx) // ends the delivery span after its settlement
	return err
}
