package mysql

import (
	"context"

	"github.com/rowactor/rowactor/dialects"
)

// init registers the dialect for rowactor.Open: importing this package (even as
// `import _ "github.com/rowactor/rowactor/dialects/mysql"`) is what links its driver.
func init() {
	dialects.Register("mysql", func(ctx context.Context, addr string) (dialects.Dialect, error) {
		d, err := Open(ctx, addr)
		if err != nil {
			return nil, err // never a nil *Dialect inside a non-nil interface
		}
		return d, nil
	})
}
