package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// checkOutboxIDs refuses an outbox table whose ids SQLite can hand out again: once the
// service purges the processed records at the top, the next record gets a purged
// record's id, and a consumer's Dedupe takes it for the old record and skips its effect.
func (d *Dialect) checkOutboxIDs(ctx context.Context, t dialects.OutboxTable) error {
	reused, err := d.idsReused(ctx, t.Name, t.ID)
	if err != nil || reused == "" {
		return err
	}
	return &dialects.ConfigError{Table: t.Name, Column: t.ID, Option: "outbox.Table.ID",
		Reason: reused + ": consumers recognise a record sent twice by its id, and a Dedupe would take a new record " +
			"for a purged one with a reused id and skip its effect",
		Fix: fmt.Sprintf("recreate the table with %s INTEGER PRIMARY KEY AUTOINCREMENT (outbox.Schema renders it), "+
			"copy the records over, and set sqlite_sequence's seq for the table to at least the highest id ever handed out",
			quote(t.ID))}
}

// CheckCancelRequests refuses a queue table with cancel requests whose ids SQLite can
// hand out again: a request left by an asker that died would cancel a later row given
// the same id.
func (d *Dialect) CheckCancelRequests(ctx context.Context, t dialects.Table) error {
	reused, err := d.idsReused(ctx, t.Name, t.ID)
	if err != nil || reused == "" {
		return err
	}
	return &dialects.ConfigError{Table: t.Name, Column: t.ID, Option: "Table.CancelRequests",
		Reason: reused + ": cancel requests name rows by id, and a request left behind would cancel a later row given the same id",
		Fix: fmt.Sprintf("recreate the table with %s INTEGER PRIMARY KEY AUTOINCREMENT (Schema renders it) and copy the rows over, or drop CancelRequests",
			quote(t.ID))}
}

var _ dialects.CancelRequestChecker = (*Dialect)(nil)

// idsReused says why SQLite may hand out table's ids again ("" when it never does). Only
// the rowid alias (the table's one INTEGER PRIMARY KEY column) is assigned by SQLite,
// and without AUTOINCREMENT it takes max(id)+1, the id of a deleted row at the top.
// AUTOINCREMENT keeps the highest id ever handed out in sqlite_sequence and never goes
// below it.
//
// SQLite reports AUTOINCREMENT only in the table's CREATE TABLE text (sqlite_schema.sql);
// it allows the keyword on the rowid alias alone, so the keyword anywhere in that text, as
// a word outside literals, identifiers and comments, is the alias's.
func (d *Dialect) idsReused(ctx context.Context, table, id string) (string, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT name, type, pk FROM pragma_table_info(?)", table)
	if err != nil {
		return "", fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
	}
	var idType string
	keys, isKey := 0, false
	for rows.Next() {
		var (
			name, typ string
			pk        int
		)
		if err := rows.Scan(&name, &typ, &pk); err != nil {
			rows.Close()
			return "", fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
		}
		if pk > 0 {
			keys++
		}
		if strings.EqualFold(name, id) {
			idType, isKey = typ, pk > 0
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("sqlite: read the columns of table %s: %w", table, err)
	}
	if !isKey || keys != 1 || !strings.EqualFold(idType, "INTEGER") {
		return "the id column is not the table's INTEGER PRIMARY KEY, so SQLite does not assign it and nothing keeps an id from being used again", nil
	}
	var text string
	err = d.db.QueryRowContext(ctx, "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE "+
		"UNION ALL SELECT sql FROM sqlite_temp_master WHERE type = 'table' AND name = ? COLLATE NOCASE LIMIT 1", table, table).Scan(&text)
	if errors.Is(err, sql.ErrNoRows) {
		return "", &dialects.ConfigError{Table: table, Reason: "the table does not exist", Fix: "create it first (Schema renders its CREATE TABLE)"}
	}
	if err != nil {
		return "", fmt.Errorf("sqlite: read the definition of table %s: %w", table, err)
	}
	if !hasKeyword(text, "AUTOINCREMENT") {
		return "the id column is INTEGER PRIMARY KEY without AUTOINCREMENT, and SQLite hands out max(id)+1, so the ids of deleted rows at the top are reused", nil
	}
	return "", nil
}

// hasKeyword reports whether word occurs in the SQL text as a bare word (any case), not
// inside a string literal, a quoted identifier or a comment.
func hasKeyword(text, word string) bool {
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == '\'' || c == '"' || c == '`':
			i = skipQuoted(text, i, c)
		case c == '[':
			if j := strings.IndexByte(text[i:], ']'); j >= 0 {
				i += j + 1
			} else {
				i = len(text)
			}
		case c == '-' && strings.HasPrefix(text[i:], "--"):
			if j := strings.IndexByte(text[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(text)
			}
		case c == '/' && strings.HasPrefix(text[i:], "/*"):
			if j := strings.Index(text[i+2:], "*/"); j >= 0 {
				i += j + 4
			} else {
				i = len(text)
			}
		case isWordByte(c):
			j := i
			for j < len(text) && isWordByte(text[j]) {
				j++
			}
			if strings.EqualFold(text[i:j], word) {
				return true
			}
			i = j
		default:
			i++
		}
	}
	return false
}

// skipQuoted returns the index after the quoted run opening at i (a doubled quote stays
// inside it).
func skipQuoted(text string, i int, q byte) int {
	for j := i + 1; j < len(text); j++ {
		if text[j] == q {
			if j+1 < len(text) && text[j+1] == q {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(text)
}

func isWordByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || ('0' <= c && c <= '9') || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}
