package dialects

import (
	"fmt"
	"time"
)

// Events of the service's own: a subscription may replace a settlement statement with
// its own SQL, and a handler may settle with an event of its own name. The statements an
// event may replace are ack, drop, retry, retry_after, dead_letter, and the lease form's
// extend.
//
// The SQL names its values with {placeholders}. A dialect compiles it once, at Open, into
// its own parameter syntax.
//
// An event runs where the form runs its settlement:
//
//   - row lock form: in the claim transaction;
//   - advisory form: on the connection that holds the key;
//   - lease form: in a transaction that first locks the row and confirms it still holds
//     the delivery's token. A late holder's event never runs, and the settlement
//     reports the lease lost.

// The names of the settlements an event may replace.
const (
	EventAck        = "ack"
	EventDrop       = "drop"
	EventRetry      = "retry"
	EventRetryAfter = "retry_after"
	EventDeadLetter = "dead_letter"
	EventExtend     = "extend"
)

// EventParam is a value an event's SQL may name.
type EventParam uint8

const (
	// ParamID is {id}: the row's id. Every event names it.
	ParamID EventParam = iota + 1
	// ParamNow is {now}: the settlement's time.
	ParamNow
	// ParamAt is {at}: when a retry_after row becomes due.
	ParamAt
	// ParamError is {error}: the text the handler gave with Fail or Outcome.WithError, or
	// "" when none.
	ParamError
	// ParamGroup is {group}: the subscription's group, or "" for a table without groups.
	ParamGroup
	// ParamDeadLetter is {dead_letter}: the dead-letter group, or "" when none.
	ParamDeadLetter
	// ParamAttempt is {attempt}: the attempt the delivery reported.
	ParamAttempt
	// ParamHeld is {held}: the lease token the delivery holds. Only extend names it.
	ParamHeld
	// ParamUntil is {until}: the new lease expiry. Only extend names it.
	ParamUntil
	// ParamArg is {arg1}, {arg2}, ...: the handler's values given to Custom. Only custom
	// events name it.
	ParamArg
)

// EventRef is one placeholder of a compiled event, in order.
type EventRef struct {
	Param EventParam
	Arg   int // ParamArg's index from 0
}

// Event is an event's SQL in a dialect's parameter syntax, with the values its
// placeholders take, in order.
type Event struct {
	Name string
	Text string
	Refs []EventRef
}

// EventValues are the values an event binds.
type EventValues struct {
	ID         int64
	Now, At    time.Time
	Error      string
	Group      string
	DeadLetter string
	Attempt    int
	Held       time.Time
	Until      time.Time
	Args       []any
}

// Args returns the event's arguments for v, in placeholder order. Times go through
// timeValue, the dialect's way of binding a time; a nil timeValue binds time.Time as is.
func (e *Event) Args(v *EventValues, timeValue func(time.Time) any) ([]any, error) {
	tv := func(t time.Time) any {
		if timeValue == nil {
			return t
		}
		return timeValue(t)
	}
	args := make([]any, len(e.Refs))
	for i, r := range e.Refs {
		switch r.Param {
		case ParamID:
			args[i] = v.ID
		case ParamNow:
			args[i] = tv(v.Now)
		case ParamAt:
			args[i] = tv(v.At)
		case ParamError:
			args[i] = v.Error
		case ParamGroup:
			args[i] = v.Group
		case ParamDeadLetter:
			args[i] = v.DeadLetter
		case ParamAttempt:
			args[i] = v.Attempt
		case ParamHeld:
			args[i] = tv(v.Held)
		case ParamUntil:
			args[i] = tv(v.Until)
		case ParamArg:
			if r.Arg >= len(v.Args) {
				return nil, fmt.Errorf("event %q names {arg%d}, and the handler's Event gave %d values", e.Name, r.Arg+1, len(v.Args))
			}
			a := v.Args[r.Arg]
			if t, ok := a.(time.Time); ok {
				a = tv(t)
			}
			args[i] = a
		}
	}
	return args, nil
}

// CheckEventName refuses an event name that cannot be told from a placeholder or a log
// field: a name is letters, digits and underscores, starting with a letter.
func CheckEventName(table, name string) error {
	ok := name != ""
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case (r >= '0' && r <= '9' || r == '_') && i > 0:
		default:
			ok = false
		}
	}
	if !ok {
		return &ConfigError{Table: table, Option: fmt.Sprintf("OnEvent(%q)", name),
			Reason: "an event name is letters, digits and underscores, starting with a letter",
			Fix:    "rename the event, e.g. \"audit_ack\""}
	}
	return nil
}
