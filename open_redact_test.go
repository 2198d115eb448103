package rowactor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// openTargets are the URLs the fuzz target opens, by the seed's kind: each scheme Open
// accepts, on a server that answers and on a port nothing listens on, and a scheme it
// refuses. USER and PASS stand for the fuzzed user and password, written into the URL as
// they are (unencoded, as users get them wrong).
var openTargets = []string{
	"postgres://USER:PASS@127.0.0.1:5432/test?sslmode=disable&connect_timeout=3",
	"postgresql://USER:PASS@127.0.0.1:1/test?sslmode=disable&connect_timeout=3",
	"mysql://USER:PASS@tcp(127.0.0.1:3306)/test?timeout=3s",
	"mysql://USER:PASS@tcp(127.0.0.1:1)/test?timeout=3s",
	// MySQL URLs, which Open turns into the driver's DSN.
	"mysql://USER:PASS@127.0.0.1:3306/test?timeout=3s",
	"mariadb://USER:PASS@127.0.0.1:1/test?timeout=3s",
	"oracle://USER:PASS@127.0.0.1:1521/test",
	"sqlite:USER:PASS@/nonexistent-dir/x.db",
	// Bare MySQL DSNs, which Open reads as mysql://.
	"USER:PASS@tcp(127.0.0.1:3306)/test?timeout=3s",
	"USER:PASS@tcp(127.0.0.1:1)/test?timeout=3s",
}

// passwordPieces are the password and its pieces split at '@' and ':' (which a parser takes
// for the end of the userinfo or the start of a port) of length 3 or more: none may
// appear in an error.
func passwordPieces(password string) []string {
	var out []string
	if len(password) >= 3 {
		out = append(out, password)
	}
	for _, p := range strings.FieldsFunc(password, func(r rune) bool { return r == '@' || r == ':' }) {
		if len(p) >= 3 {
			out = append(out, p)
		}
	}
	return out
}

// FuzzOpenHidesPasswords: whatever the URL's shape and whatever the driver answers, no
// part of the password reaches Open's error.
func FuzzOpenHidesPasswords(f *testing.F) {
	for kind := range openTargets {
		k := uint8(kind)
		f.Add(k, "app", "Tr0ub@dor3")             // an unencoded @: the rest reads as the host
		f.Add(k, "app", "s3cr:et99")              // an unencoded ':': the rest reads as a port
		f.Add(k, "app", "pa/ssw0rd")              // an unencoded '/': the rest reads as the path
		f.Add(k, "app", "pa?ssw0rd")              // an unencoded '?': the rest reads as the query
		f.Add(k, "app", "pa#ssw0rd")              // an unencoded '#': the rest reads as a fragment
		f.Add(k, "app", "100%sure")               // a '%' that is no escape
		f.Add(k, "app", "Tr0ub%40dor3")           // the encoded form, correct
		f.Add(k, "app", "with spaces in")         // spaces
		f.Add(k, "app", "")                       // an empty password
		f.Add(k, "app", "127.0.0.1")              // the password equal to the host
		f.Add(k, "app", "tcp(127.0.0.1:3306)")    // the password equal to MySQL's address
		f.Add(k, "Tr0ub@dor3", "Tr0ub@dor3")      // user and password alike
		f.Add(k, "ap:p", "x@y:zz@q:Tr0ub@dor3@w") // everything at once
	}
	f.Fuzz(func(t *testing.T, kind uint8, user, password string) {
		if strings.ContainsAny(user+password, "\x00") {
			t.Skip("a NUL byte is no URL text")
		}
		url := strings.NewReplacer("USER", user, "PASS", password).Replace(openTargets[int(kind)%len(openTargets)])
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// Whatever the driver's text: one that echoes the URL, the password and its
		// pieces glued to a host, as a parser cutting the URL at the wrong '@' would.
		echo := []string{"driver:", url, password, user + ":" + password}
		for _, p := range passwordPieces(password) {
			echo = append(echo, "lookup "+p+"@127.0.0.1", "port :"+p, `"`+p+`"`)
		}
		check := func(what string, err error) {
			msg := err.Error()
			for _, p := range passwordPieces(password) {
				if strings.Contains(msg, p) {
					t.Fatalf("%s(%q): the error shows %q of the password:\n%s", what, url, p, msg)
				}
			}
		}
		check("openError", openError(url, errors.New(strings.Join(echo, " "))))

		b, err := Open(ctx, url)
		if err == nil {
			if _, err := b.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			return
		}
		check("Open", err)
	})
}

// A password with an unencoded '@' fails to connect to a host made of the password's end:
// the error says so and how to write it, and shows no piece of the password.
func TestOpenSaysAnUnencodedAtLooksLikeAHost(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://app:Tr0ub@dor3@127.0.0.1:5432/test?sslmode=disable&connect_timeout=3",
		"postgresql://app:Tr0ub@dor3@127.0.0.1:1/test?sslmode=disable&connect_timeout=3",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		b, err := Open(ctx, url)
		cancel()
		if err == nil {
			b.Shutdown(context.Background())
			t.Fatalf("Open(%q) succeeded", url)
		}
		msg := err.Error()
		t.Log(msg)
		for _, p := range []string{"Tr0ub", "dor3"} {
			if strings.Contains(msg, p) {
				t.Errorf("the error shows %q of the password: %s", p, msg)
			}
		}
		if !strings.Contains(msg, "unencoded '@'") || !strings.Contains(msg, "%40") {
			t.Errorf("the error does not say to write the '@' as %%40: %s", msg)
		}
		if !strings.Contains(msg, "app:xxxxx@127.0.0.1") {
			t.Errorf("the error does not show the URL with its password hidden: %s", msg)
		}
	}
}

// The masked error still matches what its cause matched.
func TestOpenErrorKeepsItsCause(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Open(ctx, "postgres://app:s3cret@127.0.0.1:5432/test?sslmode=disable")
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Open with a cancelled context = %v, want context.Canceled", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("the error shows the password: %v", err)
	}
}

// mask leaves no secret in the text, however the secrets and the mask meet.
func TestMaskLeavesNoSecret(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ text, password string }{
		{"lookup dor3@127.0.0.1: no such host", "Tr0ub@dor3"},
		{"xxxxx and axxxxxb", "xxx:abc"},
		{"a:b:c:d:e:f:g:h:i:j:k:l:m:n:o:p:q:r:s:t:u:v:w:x:y:z:a:b:c:d:e:f:g:h:i:j:k:l:m:n:o:p", "a:b:c:d:e:f:g:h:i:j:k:l:m:n:o:p:q:r:s:t:u:v:w:x:y:z:a:b:c:d:e:f:g:h:i:j:k:l:m:n:o:p"},
		{`open "abc\x01def": no`, "abc\x01def"},
	} {
		got := mask(c.text, secrets("postgres://u:"+c.password+"@h/db"))
		for _, p := range passwordPieces(c.password) {
			if strings.Contains(got, p) {
				t.Errorf("mask(%q) = %q: shows %q", c.text, got, p)
			}
		}
		t.Logf("%q -> %q", c.text, got)
	}
}
