package dialects

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"syscall"
)

// Fault is what kind of failure a database error is, as far as recovering from it goes.
// The runtime picks its restart delay and its log level by the fault, never by an error's
// text.
type Fault uint8

const (
	// FaultUnknown is an error no rule knows: restart after the normal backoff.
	FaultUnknown Fault = iota
	// FaultConnection is a lost connection or an unreachable server: the pool opens a new
	// connection when the server is back, so the actor restarts after a backoff that grows
	// while the server stays away.
	FaultConnection
	// FaultContention is a deadlock, a lock wait timeout, a serialization failure or a
	// busy database file: the same statement will likely succeed at once, so the restart
	// waits the shortest delay and does not grow.
	FaultContention
	// FaultSchema is a missing table or column, or a privilege the statement lacks: only
	// an operator can fix it, so the restart starts slow and the log says what is wrong.
	FaultSchema
	// FaultData is a value one row holds that a statement cannot take or a claim cannot
	// read: out of range, of the wrong type, or violating a constraint. It covers
	// SQLSTATE classes 22 and 23, their MySQL numbers, SQLite's mismatch and constraint
	// codes, and ErrRowData. It is the row's fault, not the queue's: the runtime sets the
	// row aside.
	FaultData
)

func (f Fault) String() string {
	switch f {
	case FaultConnection:
		return "connection"
	case FaultContention:
		return "contention"
	case FaultSchema:
		return "schema"
	case FaultData:
		return "data"
	}
	return "unknown"
}

// FaultClassifier is a dialect that can tell its driver's error classes apart: SQLSTATE
// codes, server error numbers, the driver's sentinel errors.
type FaultClassifier interface {
	// Classify names the fault of err, which may wrap the driver's error.
	Classify(err error) Fault
}

// Classify asks d to classify err when it can. Otherwise it recognizes what every Go
// database driver shares: a dropped or refused network connection, database/sql's
// driver.ErrBadConn, an EOF from a closed socket. A row that cannot be read, ErrRowData,
// is FaultData whatever the dialect.
func Classify(d Dialect, err error) Fault {
	if err == nil {
		return FaultUnknown
	}
	if errors.Is(err, ErrRowData) {
		return FaultData
	}
	if c, ok := d.(FaultClassifier); ok {
		if f := c.Classify(err); f != FaultUnknown {
			return f
		}
	}
	return ClassifyNetwork(err)
}

// ClassifyNetwork recognizes the connection faults every driver shares. A context that
// ended is not a fault of the database: FaultUnknown.
func ClassifyNetwork(err error) Fault {
	switch {
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return FaultUnknown
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, net.ErrClosed):
		return FaultConnection
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return FaultConnection
	}
	return FaultUnknown
}
