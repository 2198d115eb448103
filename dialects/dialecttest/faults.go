package dialecttest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// faultScenarios are the classification of real database errors (dialects.Classify).
var faultScenarios = []scenario{
	{name: "ClassifyRealFaults", run: testClassifyRealFaults},
}

// Each fault, produced on the database, has its class, bare and wrapped the way the
// runtime wraps claim errors: a missing table or column is the schema's, an ended context
// the caller's; the harness adds the faults only its database has (FaultMaker).
func testClassifyRealFaults(t *testing.T, h Harness) {
	e := setup(t, h)
	name := e.name("fault")
	e.exec("CREATE TABLE " + e.q(name) + " (id " + e.caps.Types.ID + ", v " + e.caps.Types.Text + ")")
	e.exec("INSERT INTO " + e.q(name) + " (v) VALUES ('x')")
	if n := e.count("SELECT COUNT(*) FROM " + e.q(name) + " WHERE id = 1"); n != 1 {
		t.Fatalf("the first row's id is not 1")
	}

	check := func(what string, err error, want dialects.Fault) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		for _, err := range []error{err, fmt.Errorf("claim leases: %w", err)} {
			if got := dialects.Classify(e.d, err); got != want {
				t.Errorf("%s: Classify(%v) = %v, want %v", what, err, got, want)
			}
		}
	}

	check("missing table", h.Try(ctx, e.d, "SELECT * FROM "+e.q(name+"_missing")), dialects.FaultSchema)
	check("missing column", h.Try(ctx, e.d, "SELECT nope FROM "+e.q(name)), dialects.FaultSchema)

	// A context that ended is the caller's doing, not the database's.
	canceled, stop := context.WithCancel(ctx)
	stop()
	check("canceled context", h.Try(canceled, e.d, "SELECT 1"), dialects.FaultUnknown)
	expired, stop := context.WithTimeout(ctx, time.Nanosecond)
	defer stop()
	<-expired.Done()
	check("expired context", h.Try(expired, e.d, "SELECT 1"), dialects.FaultUnknown)

	if m, ok := h.(FaultMaker); ok {
		for _, f := range m.MakeFaults(t, e.d, name) {
			check(f.What, f.Err, f.Want)
		}
	}
}
