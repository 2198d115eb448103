package dialects

import (
	"context"
	"time"
)

// Elector is a dialect that elects one leader of a name among every process on the
// database, for work one process at a time should do (retention). The leadership is a
// session lock on a connection the leader keeps: it ends with the leader's session, so a
// leader that dies hands it over by itself. SQLite elects within the process (its keys
// live in the process): processes sharing one file each lead.
type Elector interface {
	// Lead tries, without waiting, to lead name. ok is false when another session leads
	// it.
	Lead(ctx context.Context, name string) (l Leadership, ok bool, err error)
}

// Leadership is a name an Elector made this process lead.
type Leadership interface {
	// Alive reports an error once the leadership may be gone (its session does not
	// answer): the holder stops leading, and tries Lead again later.
	Alive(ctx context.Context) error
	// Resign gives the leadership up and ends its session's hold.
	Resign(ctx context.Context) error
}

// Retainer is a dialect that deletes a table's finished rows.
type Retainer interface {
	// DeleteProcessed deletes up to limit rows of t whose processed_at is before before,
	// lowest ids first, in one short statement that waits for no lock, and reports how
	// many it deleted. A limit of 0 checks the description against the live table and
	// deletes nothing.
	DeleteProcessed(ctx context.Context, t Table, before time.Time, limit int) (int64, error)
}

// LeaderKey is the advisory key a leadership of name is held under, apart from the keys
// of the advisory form's rows.
func LeaderKey(name string) string { return "rowactor.leader:" + name }
