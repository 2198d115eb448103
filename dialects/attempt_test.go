package dialects_test

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// TestAttemptsMadeMatchesWhatHandlersRead walks one row through each form's counting and
// checks that AttemptsMade reads the number of handler calls at every stage.
func TestAttemptsMadeMatchesWhatHandlersRead(t *testing.T) {
	cases := []struct {
		stage    string
		form     dialects.Form
		column   int64
		finished bool
		want     int64
	}{
		{"lease: published", dialects.FormLease, 1, false, 0},
		{"lease: first call under way", dialects.FormLease, 2, false, 1},
		{"lease: acked on the first call, kept", dialects.FormLease, 2, true, 1},
		{"lease: waiting after two failed calls", dialects.FormLease, 3, false, 2},
		{"lease: dead after three calls", dialects.FormLease, 4, true, 3},
		{"advisory: dead after three calls", dialects.FormAdvisory, 4, true, 3},
		{"row lock: published", dialects.FormRowLock, 1, false, 0},
		{"row lock: acked on the first call, kept", dialects.FormRowLock, 1, true, 1},
		{"row lock: waiting after two failed calls", dialects.FormRowLock, 3, false, 2},
		{"row lock: dead after three calls", dialects.FormRowLock, 3, true, 3},
		{"a column below 1 (written by hand)", dialects.FormLease, 0, false, 0},
	}
	for _, c := range cases {
		if got := dialects.AttemptsMade(c.form, c.column, c.finished); got != c.want {
			t.Errorf("%s: AttemptsMade(%v, %d, %v) = %d, want %d", c.stage, c.form, c.column, c.finished, got, c.want)
		}
	}
}
