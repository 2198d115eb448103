package adminsql

import (
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

// QueuedText is the statement that reads the id and payload of each row of t queued for
// a group, in id order. A row queued for the group is unfinished (when t has processed_at)
// and, when t has a group column, in the group whose placeholder is group.
func QueuedText(t dialects.Table, quote func(string) string, group string) string {
	var where []string
	if t.Group != "" {
		where = append(where, quote(t.Group)+" = "+group)
	}
	if t.ProcessedAt != "" {
		where = append(where, quote(t.ProcessedAt)+" IS NULL")
	}
	text := "SELECT " + quote(t.ID) + ", " + quote(t.Payload) + " FROM " + quote(t.Name)
	if len(where) > 0 {
		text += " WHERE " + strings.Join(where, " AND ")
	}
	return text + " ORDER BY " + quote(t.ID)
}
