package dialects

// AttemptsMade is how many times a row's handler was called, as the handlers read their
// attempts (1, 2, 3…), from the attempt column as stored: the one number Inspect, the
// dashboard and the command line show for a row, whatever its form.
//
// The column counts differently by form. The lease and advisory forms count at the claim,
// so the column runs one ahead of the calls made: a row published reads 1, a row acked on
// its first delivery 2. The row lock form counts when a retry returns the row: a row
// waiting reads one more than the calls made, and a finished row (processed, or moved to
// its dead letter by its last call's failure) reads the calls made.
//
// A row in work counts the call under way in the lease and advisory forms; the row lock
// form cannot tell a row in work from a waiting one, and counts the calls finished.
func AttemptsMade(form Form, column int64, finished bool) int64 {
	made := column - 1
	if form == FormRowLock && finished {
		made = column
	}
	return max(made, 0)
}
