package postgres

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/dialecttest"
)

// Every literal rowactor renders into SQL means the same text whatever the session's
// standard_conforming_strings: with the setting off a backslash inside '…' escapes, so a
// literal rendered only by doubling quotes changes its text (or ends early, a syntax
// error), and two processes with different settings would lock different keys for one
// row. Each case runs with the setting on and off; the advisory key, the FIFO guard and
// the NOTIFY payload must be byte for byte the host's text under both.
func TestLiteralsUnderEitherStandardConformingStrings(t *testing.T) {
	for _, setting := range []string{"on", "off"} {
		t.Run("standard_conforming_strings="+setting, func(t *testing.T) {
			d := openURL(t, withParams(testURL(), "pool_max_conns=8", "standard_conforming_strings="+setting))
			var got string
			if err := d.Pool().QueryRow(ctx, "SHOW standard_conforming_strings").Scan(&got); err != nil || got != setting {
				t.Fatalf("standard_conforming_strings = %q (%v), want %q", got, err, setting)
			}
			for i, odd := range oddNames {
				t.Run("advisory key "+strconv.Itoa(i), func(t *testing.T) { literalAdvisoryKey(t, d, odd, advisoryTemplates[i]) })
				t.Run("fifo guard "+strconv.Itoa(i), func(t *testing.T) { literalFIFOGuard(t, d, odd) })
				t.Run("notify payload "+strconv.Itoa(i), func(t *testing.T) { literalNotify(t, d, odd) })
			}
		})
	}
}

// oddNames are table name suffixes: one with a backslash before a quote and a backslash
// at the end (a syntax error when misread), one whose backslash silently changes the text
// when misread (\b is a backspace).
var oddNames = []string{`\'q\`, `\b`}

// oddName is a unique table name ending in suffix, dropped when the test ends.
func oddName(t *testing.T, d *Dialect, suffix string) string {
	t.Helper()
	name := `rapg_` + tableNameSuffix(t) + suffix
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := d.Pool().Exec(cctx, "DROP TABLE IF EXISTS "+quote(name)); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
}

// advisoryTemplates are key templates, {id} standing for the row's id: quotes and a
// final backslash (a syntax error when misread), and \n, which silently reads as a line
// feed when misread.
var advisoryTemplates = []string{`k\'{id}\n\`, `k\n{id}`}

func literalAdvisoryKey(t *testing.T, d *Dialect, odd, template string) {
	tbl := dialects.Table{Name: oddName(t, d, odd), ID: "id", Payload: "payload", Attempt: "attempt",
		AdvisoryKey: template}
	createTable(t, d, tbl)
	id := insertRow(t, d, tbl, "")
	q := dialecttest.OpenAdvisory(t, d, dialects.QueueSpec{Table: tbl})
	want := strings.ReplaceAll(template, "{id}", strconv.FormatInt(id, 10))
	cands, err := q.Candidates(ctx, t0, 10)
	if err != nil {
		t.Fatalf("Candidates: %v", err)
	}
	if len(cands) != 1 || cands[0].ID != id || cands[0].Key != want {
		t.Fatalf("candidates %+v, want row %d with key %q", cands, id, want)
	}
	s := dialecttest.NewSession(t, q)
	if !dialecttest.TryLock(t, s, cands[0].Key) {
		t.Fatal("lock refused")
	}
	// The lock is on the hash of the host's text, computed from a bound parameter.
	if n := locksHeld(t, d, want); n != 1 {
		t.Fatalf("%d locks on hashtextextended(%q, 0), want 1", n, want)
	}
	unlock(t, s)
}

func literalFIFOGuard(t *testing.T, d *Dialect, odd string) {
	for _, lease := range []bool{false, true} {
		tbl := rowLockTable(oddName(t, d, odd))
		if lease {
			tbl = leaseTable(tbl.Name)
		}
		tbl.ProcessedAt, tbl.FIFO = "processed_at", true
		createTable(t, d, tbl)
		a := insertRow(t, d, tbl, "g")
		q := dialecttest.NewFIFOClaimer(t, dialecttest.OpenQueue(t, d, dialects.QueueSpec{Table: tbl, Group: "g", DeadLetterGroup: "dead"}), tbl)
		tx, err := d.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		// The guard as the host means it: the table's own name, bound.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || $2, 0))", tbl.Name, "g"); err != nil {
			t.Fatal(err)
		}
		if got := q.Claim(t0); got != 0 {
			t.Fatalf("lease %v: row %d was claimed while the group's guard was held: the claim locked another key", lease, got)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if got := q.Claim(t0); got != a {
			t.Fatalf("lease %v: claimed %d once the guard was free, want %d", lease, got, a)
		}
		q.Ack(a, t0)
	}
}

func literalNotify(t *testing.T, d *Dialect, odd string) {
	tbl := leaseTable(oddName(t, d, odd))
	createTable(t, d, tbl)
	wakes := make(chan wakeCall, 100)
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = d.Listen(lctx, wakeInto(lctx, wakes))
	}()
	defer wg.Wait()
	defer cancel()
	deadline := time.After(10 * time.Second)
	// The first wake (everything) says the listener is in place.
	select {
	case <-wakes:
	case <-deadline:
		t.Fatal("the listener never connected")
	}
	group := `g\'h\` + odd
	dialecttest.Publish(t, d, tbl, dialects.Message{Group: group, Payload: []byte("p")})
	for {
		select {
		case w := <-wakes:
			if w == (wakeCall{tbl.Name, group}) {
				return
			}
			if w.table != "" {
				t.Logf("other wake %+v", w)
			}
		case <-deadline:
			t.Fatalf("no wake for table %q group %q", tbl.Name, group)
		}
	}
}

// insertRow inserts a row with bound values only (not through the publisher, which the
// notify case tests), so each case fails for its own literal.
func insertRow(t *testing.T, d *Dialect, tbl dialects.Table, group string) int64 {
	t.Helper()
	cols, vals, args := quote(tbl.Payload), "$1", []any{[]byte("p")}
	if tbl.Group != "" {
		cols, vals, args = cols+", "+quote(tbl.Group), vals+", $2", append(args, group)
	}
	var id int64
	if err := d.Pool().QueryRow(ctx, "INSERT INTO "+quote(tbl.Name)+" ("+cols+") VALUES ("+vals+") RETURNING "+quote(tbl.ID), args...).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// unescapeFuzz reads an escape string literal, E'…', as the server does under either
// standard_conforming_strings: a doubled quote is a quote, a backslash takes the next
// character as itself (rowactor escapes nothing else). ok is false when the text is not
// one such literal: a lone quote or backslash would end it early or change a character.
func unescapeFuzz(lit string) (string, bool) {
	if !strings.HasPrefix(lit, "E'") || len(lit) < 3 || lit[len(lit)-1] != '\'' {
		return "", false
	}
	inner := lit[2 : len(lit)-1]
	var b strings.Builder
	for i := 0; i < len(inner); i++ {
		switch inner[i] {
		case '\'':
			if i+1 >= len(inner) || inner[i+1] != '\'' {
				return "", false
			}
			i++
		case '\\':
			if i+1 >= len(inner) || (inner[i+1] != '\\' && inner[i+1] != '\'') {
				return "", false
			}
			i++
		}
		b.WriteByte(inner[i])
	}
	return b.String(), true
}
