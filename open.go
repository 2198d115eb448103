package rowactor

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/rowactor/rowactor/dialects"
	"github.com/rowactor/rowactor/dialects/mysql"
	"github.com/rowactor/rowactor/dialects/postgres"
	"github.com/rowactor/rowactor/dialects/sqlite"
)

// Open opens a database by URL and returns a broker that owns it (Shutdown closes it):
//
//   - "sqlite:path/to/file.db" (or "sqlite://path"): the embedded default, with WAL, a busy
//     timeout and synchronous=NORMAL: durable against a crash of the process; a power loss
//     may take the last commits. For full durability open the *sql.DB yourself and use
//     New(sqlite.New(db)).
//   - "postgres://user@host:5432/db?sslmode=disable" (or "postgresql://"): a pgx pool.
//   - "mysql://" followed by a go-sql-driver DSN, e.g. "mysql://root@tcp(127.0.0.1:3306)/app".
func Open(ctx context.Context, url string, opts ...Option) (*Broker, error) {
	scheme, rest, _ := strings.Cut(url, ":")
	var (
		d   dialects.Dialect
		err error
	)
	switch scheme {
	case "sqlite", "sqlite3":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return nil, fmt.Errorf("rowactor: Open(%q): no file path; use sqlite:path/to/file.db", url)
		}
		d, err = openDialect(sqlite.Open(ctx, path))
	case "postgres", "postgresql":
		d, err = openDialect(postgres.Open(ctx, url))
	case "mysql":
		d, err = openDialect(mysql.Open(ctx, strings.TrimPrefix(rest, "//")))
	default:
		return nil, fmt.Errorf("rowactor: Open(%q): unknown scheme %q; use sqlite:PATH, postgres://... or mysql://DSN", redact(url), scheme)
	}
	if err != nil {
		return nil, fmt.Errorf("rowactor: Open(%q): %w", redact(url), err)
	}
	b, err := New(d, opts...)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	b.ownsD = true
	return b, nil
}

// openDialect turns a dialect constructor's typed result into the interface without
// wrapping a nil pointer in a non-nil interface.
func openDialect[D dialects.Dialect](d D, err error) (dialects.Dialect, error) {
	if err != nil {
		return nil, err
	}
	return d, nil
}

// passwordParam matches a password given as a parameter: ?password=… in a URL, or
// password=… in a key/value connection string.
var passwordParam = regexp.MustCompile(`(?i)((?:ssl)?password)=([^&\s]*)`)

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
