package dialects

// ErrorCount is how many of a group's rows hold one error text, compared on its first
// 200 characters.
type ErrorCount struct {
	Error string
	Rows  int64
}

// Rows is a result set as the dialects read it: *sql.Rows and pgx.Rows both are.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}
