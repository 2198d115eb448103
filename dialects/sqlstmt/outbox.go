package sqlstmt

import "github.com/rowactor/rowactor/dialects"

// OutboxSQL are an outbox table's statements in the `?` syntax both database/sql
// dialects share; each dialect quotes names its own way and writes its own inserts
// (MySQL reads LAST_INSERT_ID, SQLite uses RETURNING).
type OutboxSQL struct {
	columns       string // id, topic, payload[, headers], as a SELECT list
	Insert        string // INSERT INTO t (topic, payload
	Unsent        string // ? limit
	Unprocessed   string // ? after id, ? limit
	MarkSent      string // ? time, ? id
	MarkProcessed string // ? time, ? time (sent_at when unset), ? id
	State         string // ? id
}

// NewOutboxSQL renders t's statements with quote.
func NewOutboxSQL(t dialects.OutboxTable, quote func(string) string) OutboxSQL {
	tb, id := quote(t.Name), quote(t.ID)
	var s OutboxSQL
	s.columns = id + ", " + quote(t.Topic) + ", " + quote(t.Payload)
	if t.Headers != "" {
		s.columns += ", " + quote(t.Headers)
	}
	s.Insert = "INSERT INTO " + tb + " (" + quote(t.Topic) + ", " + quote(t.Payload)
	s.Unsent = "SELECT " + s.columns + " FROM " + tb + " WHERE " + quote(t.SentAt) + " IS NULL AND " +
		quote(t.ProcessedAt) + " IS NULL ORDER BY " + id + " LIMIT ?"
	s.Unprocessed = "SELECT " + s.columns + " FROM " + tb + " WHERE " + quote(t.ProcessedAt) + " IS NULL AND " +
		id + " > ? ORDER BY " + id + " LIMIT ?"
	s.MarkSent = "UPDATE " + tb + " SET " + quote(t.SentAt) + " = ? WHERE " + id + " = ?"
	// A record processed was sent, though the relay may have died before its stamp.
	s.MarkProcessed = "UPDATE " + tb + " SET " + quote(t.ProcessedAt) + " = ?, " + quote(t.SentAt) + " = COALESCE(" +
		quote(t.SentAt) + ", ?) WHERE " + id + " = ? AND " + quote(t.ProcessedAt) + " IS NULL"
	s.State = "SELECT " + quote(t.SentAt) + ", " + quote(t.ProcessedAt) + " FROM " + tb + " WHERE " + id + " = ?"
	return s
}
