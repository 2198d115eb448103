package rowactortest

import (
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/rowactor/rowactor"
)

// hub is a worker's broker's WithOnSettled hook: it tells the settlement of a row to the
// Work waiting for it, and drops the others.
type hub struct {
	mu      sync.Mutex
	waiters map[rowKey]chan rowactor.Settlement
}

type rowKey struct {
	table string
	id    int64
}

func (h *hub) settled(s rowactor.Settlement) {
	h.mu.Lock()
	ch := h.waiters[rowKey{s.Table, s.ID}]
	h.mu.Unlock()
	select {
	case ch <- s: // a nil ch (no waiter) is never ready
	default: // a later settlement of the row: the first one is the delivery's
	}
}

// wait returns the channel that gets the settlement of row id of table, and the function
// that stops waiting.
func (h *hub) wait(table string, id int64) (<-chan rowactor.Settlement, func()) {
	ch := make(chan rowactor.Settlement, 1)
	k := rowKey{table, id}
	h.mu.Lock()
	h.waiters[k] = ch
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.waiters, k)
		h.mu.Unlock()
	}
}

// testLogger is the kit brokers' default logger: warnings and errors, as rowactor logs by
// default, written to t's log, where go test shows them beside the test that caused them
// (with a failing test, or with -v) rather than on the process's stderr. Records that
// come after t ended are dropped: t panics on output once its test is over.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{out: t.Output()}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// testWriter writes to t's output until t ends.
type testWriter struct {
	mu    sync.Mutex
	out   io.Writer
	ended bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return len(p), nil
	}
	return w.out.Write(p)
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
}
