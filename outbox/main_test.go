package outbox_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every relay is stopped
// and every broker shut down by its test, and neither may leave anything running. A test
// binary started with childEnv set is a relay process a test kills instead.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	goleak.VerifyTestMain(m,
		// Pools a test has not closed yet at exit are closed by the tests' own cleanups.
		goleak.IgnoreCurrent(),
	)
}
