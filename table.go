package rowactor

import (
	"context"
	"fmt"
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// Table describes a queue table: which of its columns play which role. See
// dialects.Table for every field; only Name, ID and Payload are required.
//
//	jobs := rowactor.Table{
//		Name: "jobs", ID: "id", Payload: "payload", Group: "queue",
//		Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until",
//	}
type Table = dialects.Table

// Form is how a table's rows are claimed: row lock, lease or advisory lock.
type Form = dialects.Form

// The claim forms.
const (
	FormRowLock  = dialects.FormRowLock
	FormLease    = dialects.FormLease
	FormAdvisory = dialects.FormAdvisory
)

// Isolation is the isolation level a table declares for its transactions.
type Isolation = dialects.Isolation

// The isolation levels, on PostgreSQL and MySQL/MariaDB.
const (
	ReadUncommitted = dialects.ReadUncommitted
	ReadCommitted   = dialects.ReadCommitted
	RepeatableRead  = dialects.RepeatableRead
	Serializable    = dialects.Serializable
)

// Schema renders the CREATE TABLE statement and the recommended claim index for a
// description in the dialect's column types, so nobody has to guess the types.
func Schema(d dialects.Dialect, t Table) (string, error) {
	return d.Schema(t)
}

// ApplySchema creates t's table and its indexes, as Schema renders them, where they do
// not exist yet: it is safe to call at every start. It changes no table that exists,
// even one that differs from t (Subscribe and Publish then say what is missing).
//
// It runs through the broker (DB), the same call on every database. A dead-letter table
// is applied the same way, with its own Name.
func (b *Broker) ApplySchema(ctx context.Context, t Table) error {
	if b.closed.Load() {
		return fmt.Errorf("rowactor: apply the schema of %s: %w", t.Name, ErrClosed)
	}
	ddl, err := b.d.Schema(t)
	if err != nil {
		return err
	}
	db, err := b.DB()
	if err != nil {
		return err
	}
	// One statement per Exec: MySQL's driver refuses several unless the DSN allows them.
	for _, stmt := range strings.Split(ddl, ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("rowactor: apply the schema of %s: %w", t.Name, err)
		}
	}
	return nil
}
