package dialects

import (
	"errors"
	"fmt"
	"strings"
)

// ErrConfig is the sentinel every *ConfigError matches with errors.Is.
var ErrConfig = errors.New("rowactor: invalid configuration")

// ConfigError is a description or option that cannot work. It names the table, the
// column or option at fault, what is wrong, and the fix. It is returned before anything
// is claimed.
type ConfigError struct {
	Table  string // the queue table
	Column string // the column at fault, if one is
	Option string // the option or field at fault, if one is
	Reason string // what is wrong
	Fix    string // what to do about it
	Err    error  // the underlying error, if any
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("rowactor: ")
	sep := ""
	if e.Table != "" {
		fmt.Fprintf(&b, "table %q", e.Table)
		sep = ", "
	}
	if e.Column != "" {
		fmt.Fprintf(&b, "%scolumn %q", sep, e.Column)
		sep = ", "
	}
	if e.Option != "" {
		fmt.Fprintf(&b, "%s%s", sep, e.Option)
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.Fix != "" {
		b.WriteString("; fix: ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

// Unwrap lets errors.Is match ErrConfig and the underlying error.
func (e *ConfigError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrConfig, e.Err}
	}
	return []error{ErrConfig}
}

// CheckDescription refuses what no database can serve: missing required fields, a bad
// advisory key template, both a lease and an advisory key, a lease on the database clock,
// a column named twice.
func CheckDescription(t Table) error {
	if t.Name == "" {
		return &ConfigError{Option: "Table.Name", Reason: "the table has no name", Fix: "set Table.Name"}
	}
	if strings.Contains(t.Name, ".") {
		return &ConfigError{Table: t.Name, Option: "Table.Name", Reason: "a table name is one identifier without a dot",
			Fix: "name the table alone"}
	}
	if t.ID == "" {
		return &ConfigError{Table: t.Name, Option: "Table.ID", Reason: "the id column is required", Fix: "set Table.ID"}
	}
	if t.Payload == "" {
		return &ConfigError{Table: t.Name, Option: "Table.Payload", Reason: "the payload column is required", Fix: "set Table.Payload"}
	}
	if t.CancelRequests != "" && (t.CancelRequests == t.Name || strings.Contains(t.CancelRequests, ".")) {
		return &ConfigError{Table: t.Name, Option: "Table.CancelRequests", Reason: "the cancel-request table is a table of its own, named by one identifier without a dot",
			Fix: `name another table, e.g. "` + t.Name + `_cancels"`}
	}
	if t.AdvisoryKey != "" {
		if _, err := ParseKey(t.AdvisoryKey); err != nil {
			return &ConfigError{Table: t.Name, Option: "Table.AdvisoryKey", Reason: "the key template is malformed",
				Err: err, Fix: `write literals and {column} placeholders, e.g. "jobs-{id}"`}
		}
		if t.LockedUntil != "" {
			return &ConfigError{Table: t.Name, Option: "Table.AdvisoryKey", Reason: "a table is claimed by lease (LockedUntil) or by advisory key, not both",
				Fix: "drop LockedUntil or AdvisoryKey"}
		}
	}
	if t.LockedUntil != "" && t.DatabaseClock {
		return &ConfigError{Table: t.Name, Option: "Table.DatabaseClock", Reason: "the lease form computes its tokens on the host, so it cannot run on the database clock",
			Fix: "drop DatabaseClock (keep hosts' clocks in step) or use another form"}
	}
	if t.Isolation != "" && t.Mode != "" {
		return &ConfigError{Table: t.Name, Option: "Table.Isolation", Reason: "Isolation (PostgreSQL, MySQL) and Mode (SQLite) exclude each other",
			Fix: "declare the one your database takes"}
	}
	switch t.Isolation {
	case "", ReadUncommitted, ReadCommitted, RepeatableRead, Serializable:
	default:
		return &ConfigError{Table: t.Name, Option: "Table.Isolation", Reason: fmt.Sprintf("unknown isolation level %q", t.Isolation),
			Fix: "use ReadUncommitted, ReadCommitted, RepeatableRead or Serializable"}
	}
	switch t.Mode {
	case "", Deferred, Immediate, Exclusive:
	default:
		return &ConfigError{Table: t.Name, Option: "Table.Mode", Reason: fmt.Sprintf("unknown SQLite mode %q", t.Mode),
			Fix: "use Deferred, Immediate or Exclusive"}
	}
	if t.ClearUniqueKeyAtAck && (t.UniqueKey == "" || t.ProcessedAt == "") {
		return &ConfigError{Table: t.Name, Option: "Table.ClearUniqueKeyAtAck", Reason: "it clears the UniqueKey column of rows kept with ProcessedAt, and the table names no such pair",
			Fix: "set Table.UniqueKey and Table.ProcessedAt, or drop ClearUniqueKeyAtAck (an Ack that deletes the row frees its key anyway)"}
	}
	if t.Priority != "" && t.FIFO {
		return &ConfigError{Table: t.Name, Option: "Table.Priority", Reason: "a FIFO group is handled in id order, which a priority would reorder",
			Fix: "drop Priority, or FIFO"}
	}
	seen := map[string]string{}
	for _, c := range t.Columns() {
		if c.Role == "AdvisoryKey" {
			continue
		}
		if prev, ok := seen[c.Name]; ok {
			return &ConfigError{Table: t.Name, Column: c.Name, Option: "Table." + c.Role,
				Reason: "the column already plays the role " + prev, Fix: "give each role its own column"}
		}
		seen[c.Name] = c.Role
	}
	return nil
}
