package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// TestSplitNotDrained: a consumer shut down under a cancelled context records Shutdown's
// not-drained error apart (drain=), and only what else Shutdown returned counts as a
// shutdown error (err=).
func TestSplitNotDrained(t *testing.T) {
	// What Shutdown returns: the not-drained error, alone or joined with others.
	b, err := rowactor.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "q.db"))
	if err != nil {
		t.Fatal(err)
	}
	tb := rowactor.Table{Name: "jobs", ID: "id", Payload: "payload", LockedUntil: "locked_until"}
	ddl, err := rowactor.Schema(b.Dialect(), tb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Dialect().(*sqlite.Dialect).DB().Exec(ddl); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	if _, err := b.Subscribe(context.Background(), tb, "q", func(ctx context.Context, d *rowactor.Delivery) rowactor.Outcome {
		close(started)
		<-ctx.Done()
		return rowactor.Ack()
	}, rowactor.Lease(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(context.Background(), tb, "q", []byte("x")); err != nil {
		t.Fatal(err)
	}
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, notDrained := b.Shutdown(ctx)
	if !errors.Is(notDrained, rowactor.ErrNotDrained) {
		t.Fatalf("Shutdown with a row in work under a cancelled context: %v, want ErrNotDrained", notDrained)
	}
	other := fmt.Errorf("close the pool: %w", context.Canceled)
	for _, c := range []struct {
		err       error
		cut, rest string
	}{
		{nil, "<nil>", "<nil>"},
		{notDrained, notDrained.Error(), "<nil>"},
		{errors.Join(notDrained, other), notDrained.Error(), other.Error()},
		{errors.Join(other), "<nil>", other.Error()},
	} {
		cut, rest := splitNotDrained(c.err)
		if errText(cut) != c.cut || errText(rest) != c.rest {
			t.Errorf("splitNotDrained(%v) = %v, %v; want %s, %s", c.err, cut, rest, c.cut, c.rest)
		}
	}
}
