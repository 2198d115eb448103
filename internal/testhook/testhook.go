// Package testhook holds the seams tests use to widen a race window that the code
// crosses in microseconds, so that a test can make the race happen on every run. Every
// hook is unset outside tests, and costs one atomic load where it sits.
package testhook

import "sync/atomic"

// BeforeQueueing, when set, is called with the table's name on a delivery's goroutine
// between the planning of its settlement and its queueing (actors' queueSettlement),
// where a stop may come.
var BeforeQueueing atomic.Pointer[func(table string)]

// BeforeGiveBack, when set, is called with the table's name and the row's id on the
// goroutine of a row the measured room gives back (actors' strand.go), after the row left
// the backlog and before its release runs, where a Cancel may come.
var BeforeGiveBack atomic.Pointer[func(table string, id int64)]
