package tablecheck

import (
	"errors"
	"fmt"

	"github.com/rowactor/rowactor/dialects"
)

// Columns says which optional columns a queue table has, for MessageFits.
type Columns struct {
	Group, UniqueKey, Priority, RetryAfter bool
}

// MessageFits refuses a message that sets a field the table has no column for, naming
// the field and the column it needs. Every dialect checks it before anything is sent.
func MessageFits(m dialects.Message, has Columns) error {
	switch {
	case m.Group != "" && !has.Group:
		return fmt.Errorf("the table has no group column for Message.Group %q", m.Group)
	case m.UniqueKey != "" && !has.UniqueKey:
		return fmt.Errorf("Message.UniqueKey %q needs a unique key column, and the table has none", m.UniqueKey)
	case m.Priority != 0 && !has.Priority:
		return fmt.Errorf("Message.Priority %d needs a priority column, and the table has none", m.Priority)
	case !m.NotBefore.IsZero() && !has.RetryAfter:
		return errors.New("Message.NotBefore needs a retry_after column, and the table has none")
	}
	return nil
}
