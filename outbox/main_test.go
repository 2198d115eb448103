package outbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every relay is stopped
// and every broker shut down by its test, and neither may leave anything running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Pools a test has not closed yet at exit are closed by the tests' own cleanups.
		goleak.IgnoreCurrent(),
	)
}
