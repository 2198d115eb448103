package sqlpart

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rowactor/rowactor/dialects"
)

var paramNames = map[string]dialects.EventParam{
	"id": dialects.ParamID, "now": dialects.ParamNow, "at": dialects.ParamAt, "error": dialects.ParamError, "group": dialects.ParamGroup,
	"dead_letter": dialects.ParamDeadLetter, "attempt": dialects.ParamAttempt, "held": dialects.ParamHeld, "until": dialects.ParamUntil,
}

// allowed lists the placeholders each built-in event may name; a custom event may name
// every one but held and until, and {argN}.
var allowed = map[string][]dialects.EventParam{
	dialects.EventAck:        {dialects.ParamID, dialects.ParamNow, dialects.ParamGroup, dialects.ParamAttempt, dialects.ParamError},
	dialects.EventDrop:       {dialects.ParamID, dialects.ParamNow, dialects.ParamGroup, dialects.ParamAttempt, dialects.ParamError},
	dialects.EventRetry:      {dialects.ParamID, dialects.ParamNow, dialects.ParamGroup, dialects.ParamAttempt, dialects.ParamError},
	dialects.EventRetryAfter: {dialects.ParamID, dialects.ParamNow, dialects.ParamAt, dialects.ParamGroup, dialects.ParamAttempt, dialects.ParamError},
	dialects.EventDeadLetter: {dialects.ParamID, dialects.ParamNow, dialects.ParamGroup, dialects.ParamDeadLetter, dialects.ParamAttempt, dialects.ParamError},
	dialects.EventExtend:     {dialects.ParamID, dialects.ParamHeld, dialects.ParamUntil},
}

var customAllowed = []dialects.EventParam{dialects.ParamID, dialects.ParamNow, dialects.ParamGroup, dialects.ParamDeadLetter, dialects.ParamAttempt, dialects.ParamError, dialects.ParamArg}

// CompileEvent turns an event's SQL into a dialect's syntax: each {name} outside string
// literals, quoted identifiers and comments becomes placeholder(n) for its n-th
// occurrence (from 1), and its value is recorded in Refs. A placeholder the event may not
// name, an unclosed quote, or SQL that never names {id} is refused with a *ConfigError:
// an event without {id} would settle every row of the table.
func CompileEvent(table, name, sql string, form dialects.Form, placeholder func(n int) string) (dialects.Event, error) {
	bad := func(reason, fix string) (dialects.Event, error) {
		return dialects.Event{}, &dialects.ConfigError{Table: table, Option: fmt.Sprintf("OnEvent(%q)", name), Reason: reason, Fix: fix}
	}
	if err := dialects.CheckEventName(table, name); err != nil {
		return dialects.Event{}, err
	}
	ok, custom := allowed[name]
	custom = !custom
	if custom {
		ok = customAllowed
	}
	if name == dialects.EventExtend && form != dialects.FormLease {
		return bad("extend replaces the lease extension, and the table is not in the lease form", "drop the extend event")
	}
	if strings.TrimSpace(sql) == "" {
		return bad("the event's SQL is empty", "give the statement the event runs")
	}
	var (
		out  strings.Builder
		refs []dialects.EventRef
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
	if !slices.ContainsFunc(refs, func(r dialects.EventRef) bool { return r.Param == dialects.ParamID }) {
		return bad("the event's SQL never names {id}, so it would not be limited to the delivery's row",
			"add a condition such as WHERE id = {id}")
	}
	return dialects.Event{Name: name, Text: out.String(), Refs: refs}, nil
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

func parseParam(ph string) (dialects.EventRef, error) {
	if p, ok := paramNames[ph]; ok {
		return dialects.EventRef{Param: p}, nil
	}
	if n, found := strings.CutPrefix(ph, "arg"); found {
		if i, err := strconv.Atoi(n); err == nil && i >= 1 && i <= 64 && strconv.Itoa(i) == n {
			return dialects.EventRef{Param: dialects.ParamArg, Arg: i - 1}, nil
		}
	}
	return dialects.EventRef{}, fmt.Errorf("unknown placeholder {%s}", ph)
}

func listParams(ps []dialects.EventParam) string {
	var names []string
	for _, p := range ps {
		if p == dialects.ParamArg {
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
