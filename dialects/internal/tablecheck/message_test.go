package tablecheck

import (
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

// TestMessageFitsRefusesAFieldWithoutItsColumn: each optional field of a message needs
// its column, and the refusal names the field; a table with every column takes them all.
func TestMessageFitsRefusesAFieldWithoutItsColumn(t *testing.T) {
	all := Columns{Group: true, UniqueKey: true, Priority: true, RetryAfter: true}
	cases := []struct {
		m    dialects.Message
		miss func(*Columns)
		want string
	}{
		{dialects.Message{Group: "g"}, func(c *Columns) { c.Group = false }, "Message.Group"},
		{dialects.Message{UniqueKey: "k"}, func(c *Columns) { c.UniqueKey = false }, "Message.UniqueKey"},
		{dialects.Message{Priority: 2}, func(c *Columns) { c.Priority = false }, "Message.Priority"},
		{dialects.Message{NotBefore: time.Unix(1, 0)}, func(c *Columns) { c.RetryAfter = false }, "Message.NotBefore"},
	}
	for _, c := range cases {
		if err := MessageFits(c.m, all); err != nil {
			t.Errorf("%+v on a table with every column: %v", c.m, err)
		}
		has := all
		c.miss(&has)
		if err := MessageFits(c.m, has); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v without its column: %v, want an error naming %s", c.m, err, c.want)
		}
	}
	if err := MessageFits(dialects.Message{}, Columns{}); err != nil {
		t.Errorf("a message with no optional field on a bare table: %v", err)
	}
}
