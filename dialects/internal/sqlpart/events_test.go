package sqlpart

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

func dollar(n int) string { return "$" + strconv.Itoa(n) }

func mark(int) string { return "?" }

func TestCompileEvent(t *testing.T) {
	ev, err := CompileEvent("jobs", "audit", `UPDATE jobs SET grp = 'sent {id}', note = "{x}" /* {now} */, `+
		"why = {error}, n = {arg2} -- {until}\n WHERE id = {id} AND grp = {group}", dialects.FormLease, dollar)
	if err != nil {
		t.Fatal(err)
	}
	want := `UPDATE jobs SET grp = 'sent {id}', note = "{x}" /* {now} */, why = $1, n = $2 -- {until}` + "\n WHERE id = $3 AND grp = $4"
	if ev.Text != want {
		t.Fatalf("text\n%s\nwant\n%s", ev.Text, want)
	}
	refs := []dialects.EventRef{{Param: dialects.ParamError}, {Param: dialects.ParamArg, Arg: 1}, {Param: dialects.ParamID}, {Param: dialects.ParamGroup}}
	if len(ev.Refs) != len(refs) {
		t.Fatalf("refs %v, want %v", ev.Refs, refs)
	}
	for i := range refs {
		if ev.Refs[i] != refs[i] {
			t.Fatalf("refs %v, want %v", ev.Refs, refs)
		}
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	args, err := ev.Args(&dialects.EventValues{ID: 7, Error: "boom", Group: "g", Args: []any{"a", now}}, func(t time.Time) any { return t.Format(time.RFC3339) })
	if err != nil {
		t.Fatal(err)
	}
	if args[0] != "boom" || args[1] != "2030-01-01T00:00:00Z" || args[2] != int64(7) || args[3] != "g" {
		t.Fatalf("args %v", args)
	}
	if _, err := ev.Args(&dialects.EventValues{ID: 7, Args: []any{"only one"}}, nil); err == nil || !strings.Contains(err.Error(), "{arg2}") {
		t.Fatalf("a missing {arg2} value: %v", err)
	}

	// Repeated names are separate placeholders, in order.
	ev, err = CompileEvent("jobs", dialects.EventAck, "DELETE FROM jobs WHERE id = {id} OR parent = {id}", dialects.FormRowLock, mark)
	if err != nil || ev.Text != "DELETE FROM jobs WHERE id = ? OR parent = ?" || len(ev.Refs) != 2 {
		t.Fatalf("%q %v %v", ev.Text, ev.Refs, err)
	}
}

func TestCompileEventRefuses(t *testing.T) {
	for _, c := range []struct {
		name, sql string
		form      dialects.Form
		reason    string
	}{
		{dialects.EventAck, "DELETE FROM jobs", dialects.FormLease, "never names {id}"},
		{dialects.EventAck, "DELETE FROM jobs WHERE id = {id} AND x = {arg1}", dialects.FormLease, "may not name {arg1}"},
		{dialects.EventAck, "UPDATE jobs SET t = {until} WHERE id = {id}", dialects.FormLease, "may not name {until}"},
		{dialects.EventRetry, "UPDATE jobs SET a = {at} WHERE id = {id}", dialects.FormLease, "may not name {at}"},
		{dialects.EventExtend, "UPDATE jobs SET l = {until} WHERE id = {id} AND l = {held}", dialects.FormRowLock, "not in the lease form"},
		{"audit", "UPDATE jobs SET x = {nope} WHERE id = {id}", dialects.FormLease, "may not name {nope}"},
		{"audit", "UPDATE jobs SET x = {arg0} WHERE id = {id}", dialects.FormLease, "may not name {arg0}"},
		{"audit", "UPDATE jobs SET x = 'open WHERE id = {id}", dialects.FormLease, "never closed"},
		{"audit", "UPDATE jobs SET x = {id", dialects.FormLease, "never closed"},
		{"audit", "  ", dialects.FormLease, "empty"},
		{"1bad", "DELETE FROM jobs WHERE id = {id}", dialects.FormLease, "letters, digits and underscores"},
		{"a b", "DELETE FROM jobs WHERE id = {id}", dialects.FormLease, "letters, digits and underscores"},
	} {
		_, err := CompileEvent("jobs", c.name, c.sql, c.form, dollar)
		var ce *dialects.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, dialects.ErrConfig) {
			t.Errorf("%s %q: %v, want a *ConfigError", c.name, c.sql, err)
			continue
		}
		if !strings.Contains(err.Error(), c.reason) || !strings.Contains(err.Error(), "OnEvent(") || ce.Table != "jobs" {
			t.Errorf("%s %q: %v, want it to say %q and name the event and table", c.name, c.sql, err, c.reason)
		}
	}
}
