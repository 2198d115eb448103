package adminsql

import (
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// TestQueuedText: the group and processed_at conditions appear only for the columns the
// table describes.
func TestQueuedText(t *testing.T) {
	q := func(s string) string { return "`" + s + "`" }
	bare := dialects.Table{Name: "jobs", ID: "id", Payload: "payload"}
	full := bare
	full.Group, full.ProcessedAt = "queue", "processed_at"
	for _, c := range []struct {
		tbl  dialects.Table
		want string
	}{
		{bare, "SELECT `id`, `payload` FROM `jobs` ORDER BY `id`"},
		{full, "SELECT `id`, `payload` FROM `jobs` WHERE `queue` = :g AND `processed_at` IS NULL ORDER BY `id`"},
	} {
		if got := QueuedText(c.tbl, q, ":g"); got != c.want {
			t.Errorf("QueuedText(%+v) = %q, want %q", c.tbl, got, c.want)
		}
	}
}
