package rowactor_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rowactor/rowactor"
	"github.com/rowactor/rowactor/rowactortest"
)

// TestOpenRefusesANilClock: a nil clock (untyped, or a nil *rowactortest.Clock in the
// interface) is bad input that Open refuses with an error, neither defaulting to the
// machine's clock in silence nor panicking on a goroutine of its own.
func TestOpenRefusesANilClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, c := range map[string]rowactor.Clock{
		"untyped nil":               nil,
		"a nil *rowactortest.Clock": (*rowactortest.Clock)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "clock.db"), rowactor.WithClock(c))
			if err == nil {
				_, _ = b.Shutdown(ctx)
				t.Fatalf("Open with WithClock(%s): no error", name)
			}
		})
	}
}
