package rowactor_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/rowactor/rowactor/internal/pgwarm"
)

// TestMain fails the package if any goroutine outlives the tests: every broker is shut
// down by its test, and Shutdown must leave nothing of rowactor's running.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec)) // a consumer process started by a test
	}
	// database/sql's opener for a pool a test has not closed yet at exit is checked by
	// the pools' own Close in cleanups; the SQLite driver keeps no goroutines.
	before := goleak.IgnoreCurrent()
	code := m.Run()
	pgwarm.CloseAll() // kept between tests (driver_postgres_test.go), not leaked
	if code == 0 {
		if err := goleak.Find(before); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
