package adminsql

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// TestRequeueChunks: ids go in order, chunk by chunk, with progress after each; a chunk
// that moved another number of rows, an error and the end of ctx stop the requeue.
func TestRequeueChunks(t *testing.T) {
	ids := []int64{1, 2, 3, 4, 5, 6, 7}
	var chunks [][]int64
	var progress []int
	move := func(_ context.Context, part []int64) (int64, error) {
		chunks = append(chunks, slices.Clone(part))
		return int64(len(part)), nil
	}
	n, err := RequeueChunks(context.Background(), ids, 3, move, func(done, total int) {
		if total != len(ids) {
			t.Errorf("progress total %d, want %d", total, len(ids))
		}
		progress = append(progress, done)
	})
	if n != 7 || err != nil || !slices.Equal(progress, []int{3, 6, 7}) ||
		len(chunks) != 3 || !slices.Equal(chunks[2], []int64{7}) {
		t.Errorf("RequeueChunks: %d, %v, progress %v, chunks %v", n, err, progress, chunks)
	}

	chunks = nil
	if n, err := RequeueChunks(context.Background(), make([]int64, 2500), 0, move, nil); n != 2500 || err != nil || len(chunks) != 3 {
		t.Errorf("default chunk: %d, %v, %d chunks; want 2500 rows in 3", n, err, len(chunks))
	}

	short := func(_ context.Context, part []int64) (int64, error) { return int64(len(part)) - 1, nil }
	if _, err := RequeueChunks(context.Background(), ids, 3, short, nil); !errors.Is(err, dialects.ErrRequeueRace) {
		t.Errorf("a chunk moving fewer rows: %v, want ErrRequeueRace", err)
	}
	boom := errors.New("boom")
	failing := func(context.Context, []int64) (int64, error) { return 0, boom }
	if _, err := RequeueChunks(context.Background(), ids, 3, failing, nil); !errors.Is(err, boom) {
		t.Errorf("a failing chunk: %v, want its error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err = RequeueChunks(ctx, ids, 3, func(ctx context.Context, part []int64) (int64, error) {
		calls++
		cancel()
		return int64(len(part)), nil
	}, nil)
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("ctx ended after a chunk: %v after %d chunks, want context.Canceled after 1", err, calls)
	}
}
