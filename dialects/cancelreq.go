package dialects

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// A cancel of a row in work reaches the process holding it through a table of the
// service's database, the one Table.CancelRequests names: one row per asker and row.
//
//   - The process asking (Broker.Cancel, `rowactor cancel`) records its request under a
//     number of its own, then waits for the answer, or for the row to leave work.
//   - Each process holding rows of the table reads the unanswered requests every half
//     second while it holds any, cancels the deliveries it holds, and answers every
//     request for the row: it ended cancelled, or its delivery settled it first.
//   - The asker deletes its request when it stops waiting, answered or not. Only an
//     asker that died leaves one, which a holder then still carries out.
//
// The dialect renders the statements (CancelRequestSQL); CancelRequests runs them on
// the dialect's *sql.DB, on every database.

// The answers a holder writes.
const (
	// CancelAnswerCancelled: the holder's delivery ended the row as cancelled.
	CancelAnswerCancelled = "cancelled"
	// CancelAnswerFinished: the delivery settled the row first (acked, or moved to its
	// dead letter).
	CancelAnswerFinished = "finished"
)

// CancelRequestSQL is a dialect that renders the statements on a CancelRequests table.
type CancelRequestSQL interface {
	// CancelRequestStatements renders them for t.CancelRequests, quoted and with the
	// dialect's placeholders.
	CancelRequestStatements(t Table) (CancelRequestStatements, error)
}

// CancelRequestStatements are the statements on a CancelRequests table, whose columns
// are row_id (the queue row's id), asker (a number each request draws), reason and
// answer (NULL until a holder answers); its primary key is (row_id, asker).
type CancelRequestStatements struct {
	Create  string // CREATE TABLE IF NOT EXISTS
	Request string // args id, asker, reason: records the request, unanswered
	Pending string // no args: row_id, reason of the unanswered requests
	Answer  string // args answer, id: answers every unanswered request for the row
	Read    string // args id, asker: the answer, NULL while none
	Forget  string // args id, asker: deletes the request
}

// CancelRequestChecker is a dialect that refuses, before anything is claimed, a table
// whose cancel requests could reach the wrong row: one whose ids the database may hand
// out again (SQLite without AUTOINCREMENT).
type CancelRequestChecker interface {
	CheckCancelRequests(ctx context.Context, t Table) error
}

// CancelRequest is an unanswered request.
type CancelRequest struct {
	ID     int64
	Reason string
}

// CancelRequests runs a table's cancel-request statements.
type CancelRequests struct {
	db *sql.DB
	t  Table
	st CancelRequestStatements
}

// CancelRequestsOf returns the cancel requests of t, which names its CancelRequests
// table, on d.
func CancelRequestsOf(d Dialect, t Table) (*CancelRequests, error) {
	if t.CancelRequests == "" {
		return nil, &ConfigError{Table: t.Name, Option: "Table.CancelRequests", Reason: "the table names no cancel-request table, so a row in work can be cancelled only by the process holding it",
			Fix: `set Table.CancelRequests (e.g. "jobs_cancels") and create it with Broker.ApplySchema`}
	}
	cs, ok := d.(CancelRequestSQL)
	db, hasDB := d.(SQLDB)
	if !ok || !hasDB {
		return nil, &ConfigError{Table: t.Name, Option: "Table.CancelRequests", Reason: fmt.Sprintf("the %s dialect cannot record cancel requests", d.Name()),
			Fix: "drop CancelRequests"}
	}
	st, err := cs.CancelRequestStatements(t)
	if err != nil {
		return nil, err
	}
	return &CancelRequests{db: db.SQLDB(), t: t, st: st}, nil
}

func (c *CancelRequests) errorf(op string, err error) error {
	return fmt.Errorf("rowactor: %s on cancel-request table %s (of %s): %w", op, c.t.CancelRequests, c.t.Name, err)
}

// Request records asker's cancel of row id, unanswered.
func (c *CancelRequests) Request(ctx context.Context, id, asker int64, reason string) error {
	if _, err := c.db.ExecContext(ctx, c.st.Request, id, asker, reason); err != nil {
		return c.errorf("request a cancel", err)
	}
	return nil
}

// Pending returns the unanswered requests.
func (c *CancelRequests) Pending(ctx context.Context) ([]CancelRequest, error) {
	rows, err := c.db.QueryContext(ctx, c.st.Pending)
	if err != nil {
		return nil, c.errorf("read the requests", err)
	}
	defer rows.Close()
	var out []CancelRequest
	for rows.Next() {
		var r CancelRequest
		if err := rows.Scan(&r.ID, &r.Reason); err != nil {
			return nil, c.errorf("read the requests", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, c.errorf("read the requests", err)
	}
	return out, nil
}

// Answer records a holder's answer to every unanswered request for row id.
func (c *CancelRequests) Answer(ctx context.Context, id int64, answer string) error {
	if _, err := c.db.ExecContext(ctx, c.st.Answer, answer, id); err != nil {
		return c.errorf("answer a request", err)
	}
	return nil
}

// Read returns the answer to asker's request for row id: "" while there is none, or no
// request.
func (c *CancelRequests) Read(ctx context.Context, id, asker int64) (string, error) {
	var a sql.NullString
	err := c.db.QueryRowContext(ctx, c.st.Read, id, asker).Scan(&a)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", c.errorf("read an answer", err)
	}
	return a.String, nil
}

// Forget deletes asker's request for row id.
func (c *CancelRequests) Forget(ctx context.Context, id, asker int64) error {
	if _, err := c.db.ExecContext(ctx, c.st.Forget, id, asker); err != nil {
		return c.errorf("forget a request", err)
	}
	return nil
}

// CancelRequestsDDL is the CREATE TABLE of t's cancel-request table and its ";\n", for a
// dialect's Schema to add; "" when t names none.
func CancelRequestsDDL(cs CancelRequestSQL, t Table) (string, error) {
	if t.CancelRequests == "" {
		return "", nil
	}
	st, err := cs.CancelRequestStatements(t)
	if err != nil {
		return "", err
	}
	return st.Create + ";\n", nil
}
