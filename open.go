package rowactor

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/internal/dsn"
)

// Open opens a database by URL and returns a broker that owns it: Shutdown closes it.
// It takes these names:
//
//   - "sqlite:path/to/file.db", "sqlite://path", a bare path ending in .db, .sqlite or
//     .sqlite3, or a file URI without parameters such as "file:jobs.db". The file is
//     created if missing, with WAL and synchronous=NORMAL. For full durability, open the
//     *sql.DB yourself and use New with sqlite.New.
//   - "postgres://user@host:5432/db?sslmode=disable", or "postgresql://": a pgx pool.
//   - "mysql://user:pass@host:3306/db?params", or "mariadb://": a MySQL URL, as
//     DATABASE_URL holds it. The user and password are %-decoded, the port is 3306 when
//     none is named, an IPv6 host is written "[::1]:3306", and the parameters are
//     go-sql-driver's.
//   - "mysql://" followed by a go-sql-driver DSN, or the DSN alone with its protocol:
//     "root@tcp(127.0.0.1:3306)/app?parseTime=true".
//
// A database's dialect registers its names when its package is imported, as database/sql
// drivers do:
//
//	import _ "github.com/rowactor/rowactor/dialects/postgres"
//
// Open of a name whose dialect is not imported returns an error matching
// ErrDialectNotImported that names the import to add. Its errors never show the URL's
// password; write '@' and ':' in a URL's password %-encoded. See
// docs/operations.md, "Opening a database by URL", for every accepted form.
func Open(ctx context.Context, url string, opts ...Option) (*Broker, error) {
	t, err := dsn.Parse(url)
	if err != nil {
		msg := fmt.Sprintf("rowactor: Open(%q): %v", hideUserinfo(url), err)
		return nil, &maskedError{msg: mask(msg, secrets(url)), cause: err}
	}
	open, ok := dialects.Lookup(t.Kind)
	if !ok {
		return nil, openError(t.URL, fmt.Errorf("%w: add import _ %q to the program (it registers the %s names and links the driver)",
			ErrDialectNotImported, "github.com/rowactor/rowactor/dialects/"+t.Kind, t.Kind))
	}
	d, err := open(ctx, t.Addr)
	if err != nil {
		return nil, openError(t.URL, err)
	}
	b, err := New(d, opts...)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	b.ownsD = true
	return b, nil
}

// hideUserinfo is a name Open could not read, for its error. It may be a DSN whose
// password redact cannot find, so everything before its last '@' is hidden, and so are
// password parameters. A URL redact knows is redacted instead.
func hideUserinfo(name string) string {
	name = passwordParam.ReplaceAllString(name, "${1}=xxxxx")
	at := strings.LastIndex(name, "@")
	if at < 0 {
		return name
	}
	if strings.Contains(name[:at], "://") {
		return redact(name)
	}
	return "xxxxx" + name[at:]
}

// passwordParam matches a password given as a parameter: ?password=… in a URL, or
// password=…, perhaps quoted, in a key/value connection string.
var passwordParam = regexp.MustCompile(`(?i)((?:ssl)?password)=('(?:[^'\\]|\\.)*'?|[^&\s]*)`)

// openError is Open's error for url: the URL with its password hidden, the cause, and a
// hint when the URL's shape explains the failure. No part of the URL's password reaches
// its text, whatever the driver wrote: every piece of it is masked, as secrets lists
// them.
func openError(rawURL string, cause error) error {
	if t, err := dsn.Parse(rawURL); err == nil {
		rawURL = t.URL // a bare name in the form the masks know: mysql://DSN, sqlite:PATH
	}
	msg := fmt.Sprintf("rowactor: Open(%q): ", redact(rawURL))
	scheme, _, _ := strings.Cut(rawURL, ":")
	if info, ok := userinfo(rawURL); ok && strings.Contains(info, "@") && (scheme == "postgres" || scheme == "postgresql") {
		msg += "the URL has more than one '@' before the host: an unencoded '@' in the password makes " +
			"the rest of the password look like the host; write it as %40: "
	}
	msg += cause.Error()
	return &maskedError{msg: mask(msg, secrets(rawURL)), cause: cause}
}

// maskedError is an error whose text was masked. errors.Is matches what its cause
// matches, such as context.DeadlineExceeded, but it does not unwrap to its cause. The
// cause's own text may hold the password, and so may its fields, so errors.As does not
// reach it either.
type maskedError struct {
	msg   string
	cause error
}

func (e *maskedError) Error() string { return e.msg }

func (e *maskedError) Is(target error) bool { return errors.Is(e.cause, target) }

// userinfo returns what a URL or DSN holds before its host: after the scheme and any
// "//", up to the last '@'. ok is false when there is no '@'. The last '@' is taken
// because a password may hold unencoded ones. A '@' after the host, in the query, makes
// userinfo take more than it should, which hides more, never less.
func userinfo(rawURL string) (info string, ok bool) {
	_, rest, found := strings.Cut(rawURL, ":")
	if !found {
		return "", false
	}
	rest = strings.TrimPrefix(rest, "//")
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return "", false
	}
	return rest[:at], true
}

// pieceDelimiters are the characters a URL, DSN or connection-string parser may cut a
// password at, leaving a piece of it in what it reports: a host, a port, a path, a
// parameter. Control characters delimit too, since a driver quoting what it reports with
// %q writes them as escapes.
const pieceDelimiters = "@:/?#[]%&=()'\",; \\"

func isDelimiter(c byte) bool {
	return c < 0x20 || c == 0x7f || strings.IndexByte(pieceDelimiters, c) >= 0
}

// minSecret is the shortest text masked: shorter pieces tell little about a password, and
// masking every one- or two-letter match would leave no error readable.
const minSecret = 3

// maxSpan bounds how many delimiters a piece spans. A longer piece is still masked where
// it occurs: the shorter pieces overlapping along it cover it.
const maxSpan = 32

// secrets lists the texts no error of Open may show:
//   - the URL's userinfo, user:password;
//   - its password, after the userinfo's first ':';
//   - each piece of the password between two delimiters, and of its %-decoded form, which
//     a driver may report;
//   - the same for a password given as a parameter.
func secrets(rawURL string) []string {
	seen := make(map[string]bool)
	var out []string
	addText := func(p string) {
		// As it is, and as a driver quoting it with %q would show it.
		q := strconv.Quote(p)
		for _, x := range []string{p, q[1 : len(q)-1]} {
			if len(x) >= minSecret && !seen[x] {
				seen[x] = true
				out = append(out, x)
			}
		}
	}
	add := func(password string) {
		forPieces(password, addText)
		if dec, err := url.PathUnescape(password); err == nil && dec != password {
			forPieces(dec, addText)
		}
	}
	if info, ok := userinfo(rawURL); ok {
		if _, password, ok := strings.Cut(info, ":"); ok && password != "" {
			addText(info)
			add(password)
		}
	}
	for _, m := range passwordParam.FindAllStringSubmatch(rawURL, -1) {
		add(strings.Trim(m[2], "'"))
	}
	return out
}

// forPieces calls fn with s and every substring of s that starts and ends at a delimiter
// or at s's ends, and spans at most maxSpan delimiters.
func forPieces(s string, fn func(string)) {
	fn(s)
	cuts := []int{0}
	for i := 0; i < len(s); i++ {
		if isDelimiter(s[i]) {
			cuts = append(cuts, i, i+1)
		}
	}
	cuts = append(cuts, len(s))
	for i := 0; i < len(cuts); i += 2 { // starts: 0 and just after each delimiter
		for j := i + 1; j < len(cuts) && j <= i+2*maxSpan+1; j += 2 { // ends: at each delimiter and len(s)
			fn(s[cuts[i]:cuts[j]])
		}
	}
}

// mask replaces every occurrence of any secret in text: each run of text covered by
// occurrences becomes one mask. The mask is made of a character no secret holds, so no
// secret can reappear across a mask and the text beside it.
func mask(text string, secrets []string) string {
	if len(secrets) == 0 {
		return text
	}
	covered := make([]bool, len(text))
	for _, s := range secrets {
		for i := 0; ; {
			j := strings.Index(text[i:], s)
			if j < 0 {
				break
			}
			for k := i + j; k < i+j+len(s); k++ {
				covered[k] = true
			}
			i += j + 1
		}
	}
	m := maskRune(secrets)
	var b strings.Builder
	for i := 0; i < len(text); {
		if !covered[i] {
			b.WriteByte(text[i])
			i++
			continue
		}
		for i < len(text) && covered[i] {
			i++
		}
		b.WriteString(strings.Repeat(string(m), 5))
	}
	return b.String()
}

// maskRune is 'x', or else the first character from '*' on that no secret holds.
func maskRune(secrets []string) rune {
	held := func(r rune) bool {
		for _, s := range secrets {
			if strings.ContainsRune(s, r) {
				return true
			}
		}
		return false
	}
	if !held('x') {
		return 'x'
	}
	for r := '*'; r < utf8.MaxRune; r++ {
		if utf8.ValidRune(r) && !held(r) {
			return r
		}
	}
	return utf8.RuneError // unreachable: the secrets are finite
}

// redact hides a password in a URL or DSN before it reaches an error message.
func redact(url string) string {
	url = passwordParam.ReplaceAllString(url, "${1}=xxxxx")
	at := strings.LastIndex(url, "@")
	if at < 0 {
		return url
	}
	head := url[:at]
	start := strings.Index(head, "://")
	if start >= 0 {
		start += 3
	} else {
		start = strings.Index(head, ":") + 1
	}
	if colon := strings.Index(head[start:], ":"); colon >= 0 {
		return head[:start+colon] + ":xxxxx" + url[at:]
	}
	return url
}
