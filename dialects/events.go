package dialects

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Events of the service's own: a subscription may replace a settlement statement (ack,
// drop, retry, retry_after, dead_letter, and the lease form's extend) with its own SQL,
// and a handler may settle with an event of its own name. The SQL names its values with
// {placeholders}; a dialect compiles it once, at Open, into its own parameter syntax.
//
// An event runs where the form runs its settlement: in the claim transaction (row lock),
// on the connection that holds the key (advisory), or, in the lease form, in a
// transaction that first locks the row and confirms it still holds the delivery's token
// (a late holder's event never runs, and the settlement reports the lease lost).

// The names of the settlements an event may replace.
const (
	EventAck        = "ack"
	EventDrop       = "drop"
	EventRetry      = "retry"
	EventRetryAfter = "retry_after"
	EventDeadLetter = "dead_letter"
	EventExtend     = "extend"
)

// BuiltinEvents are the settlement names an event may replace, in the order docs list them.
var BuiltinEvents = []string{EventAck, EventDrop, EventRetry, EventRetryAfter, EventDeadLetter, EventExtend}

// EventParam is a value an event's SQL may name.
type EventParam uint8

const (
	// ParamID is {id}: the row's id. Every event names it.
	ParamID EventParam = iota + 1
	// ParamNow is {now}: the settlement's time.
	ParamNow
	// ParamAt is {at}: when a retry_after row becomes due.
	ParamAt
	// ParamError is {error}: the text the handler gave with Fail or Outcome.WithError ("" when
	// none).
	ParamError
	// ParamGroup is {group}: the subscription's group ("" for a table without groups).
	ParamGroup
	// ParamDeadLetter is {dead_letter}: the dead-letter group ("" when none).
	ParamDeadLetter
	// ParamAttempt is {attempt}: the attempt the delivery reported.
	ParamAttempt
	// ParamHeld is {held}: the lease token the delivery holds (extend only).
	ParamHeld
	// ParamUntil is {until}: the new lease expiry (extend only).
	ParamUntil
	// ParamArg is {arg1}, {arg2}, ...: the handler's values given to Custom (custom events only).
	ParamArg
)

var paramNames = map[string]EventParam{
	"id": ParamID, "now": ParamNow, "at": ParamAt, "error": ParamError, "group": ParamGroup,
	"dead_letter": ParamDeadLetter, "attempt": ParamAttempt, "held": ParamHeld, "until": ParamUntil,
}

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

// Args returns the event's arguments for v, in placeholder order; times go through
// timeValue, the dialect's way of binding a time (nil binds time.Time as is).
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
				return nil, fmt.Errorf("event %q names {arg%d}, and the handler's Custom gave %d values", e.Name, r.Arg+1, len(v.Args))
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

// allowed lists the placeholders each built-in event may name; a custom event may name
// every one but held and until, and {argN}.
var allowed = map[string][]EventParam{
	EventAck:        {ParamID, ParamNow, ParamGroup, ParamAttempt, ParamError},
	EventDrop:       {ParamID, ParamNow, ParamGroup, ParamAttempt, ParamError},
	EventRetry:      {ParamID, ParamNow, ParamGroup, ParamAttempt, ParamError},
	EventRetryAfter: {ParamID, ParamNow, ParamAt, ParamGroup, ParamAttempt, ParamError},
	EventDeadLetter: {ParamID, ParamNow, ParamGroup, ParamDeadLetter, ParamAttempt, ParamError},
	EventExtend:     {ParamID, ParamHeld, ParamUntil},
}

var customAllowed = []EventParam{ParamID, ParamNow, ParamGroup, ParamDeadLetter, ParamAttempt, ParamError, ParamArg}

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

// CompileEvent turns an event's SQL into a dialect's syntax: each {name} outside string
// literals, quoted identifiers and comments becomes placeholder(n) for its n-th
// occurrence (from 1), and its value is recorded in Refs. A placeholder the event may not
// name, an unclosed quote, or SQL that never names {id} is refused with a *ConfigError:
// an event without {id} would settle every row of the table.
func CompileEvent(table, name, sql string, form Form, placeholder func(n int) string) (Event, error) {
	bad := func(reason, fix string) (Event, error) {
		return Event{}, &ConfigError{Table: table, Option: fmt.Sprintf("OnEvent(%q)", name), Reason: reason, Fix: fix}
	}
	if err := CheckEventName(table, name); err != nil {
		return Event{}, err
	}
	ok, custom := allowed[name]
	custom = !custom
	if custom {
		ok = customAllowed
	}
	if name == EventExtend && form != FormLease {
		return bad("extend replaces the lease extension, and the table is not in the lease form", "drop the extend event")
	}
	if strings.TrimSpace(sql) == "" {
		return bad("the event's SQL is empty", "give the statement the event runs")
	}
	var (
		out  strings.Builder
		refs []EventRef
	)
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '\'' || c == '"' || c == '`':
			end := closing(sql, i+1, c)
			if end < 0 {
				return bad(fmt.Sprintf("a %c quote opened at byte %d is never closed", c, i), "close the quote")
			}
			out.WriteString(sql[i : end+1])
			i = end + 1
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			end := strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				end = len(sql) - i
			}
			out.WriteString(sql[i : i+end])
			i += end
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			end := strings.Index(sql[i+2:], "*/")
			if end < 0 {
				return bad("a /* comment is never closed", "close the comment")
			}
			out.WriteString(sql[i : i+2+end+2])
			i += 2 + end + 2
		case c == '{':
			end := strings.IndexByte(sql[i:], '}')
			if end < 0 {
				return bad(fmt.Sprintf("a { at byte %d is never closed", i), "write placeholders as {id}, {now}, ...")
			}
			ph := sql[i+1 : i+end]
			ref, err := parseParam(ph)
			if err != nil || !slices.Contains(ok, ref.Param) {
				return bad(fmt.Sprintf("the event may not name {%s}", ph), "use only "+listParams(ok))
			}
			refs = append(refs, ref)
			out.WriteString(placeholder(len(refs)))
			i += end + 1
		default:
			out.WriteByte(c)
			i++
		}
	}
	if !slices.ContainsFunc(refs, func(r EventRef) bool { return r.Param == ParamID }) {
		return bad("the event's SQL never names {id}, so it would not be limited to the delivery's row",
			"add a condition such as WHERE id = {id}")
	}
	return Event{Name: name, Text: out.String(), Refs: refs}, nil
}

// closing finds the quote that closes one opened before from; a doubled quote is an
// escaped one.
func closing(s string, from int, q byte) int {
	for i := from; i < len(s); i++ {
		if s[i] == q {
			if i+1 < len(s) && s[i+1] == q {
				i++
				continue
			}
			return i
		}
	}
	return -1
}

func parseParam(ph string) (EventRef, error) {
	if p, ok := paramNames[ph]; ok {
		return EventRef{Param: p}, nil
	}
	if n, found := strings.CutPrefix(ph, "arg"); found {
		if i, err := strconv.Atoi(n); err == nil && i >= 1 && i <= 64 && strconv.Itoa(i) == n {
			return EventRef{Param: ParamArg, Arg: i - 1}, nil
		}
	}
	return EventRef{}, fmt.Errorf("unknown placeholder {%s}", ph)
}

func listParams(ps []EventParam) string {
	var names []string
	for _, p := range ps {
		if p == ParamArg {
			names = append(names, "{arg1}, {arg2}, ...")
			continue
		}
		for n, q := range paramNames {
			if q == p {
				names = append(names, "{"+n+"}")
			}
		}
	}
	return strings.Join(names, ", ")
}
