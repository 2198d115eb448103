package mysql

import (
	"database/sql"
	"strconv"
	"strings"
	"testing"

	"github.com/rowactor/rowactor/dialects"
)

// serverPacketLimit reads the server's max_allowed_packet, as a new connection gets it.
func serverPacketLimit(t *testing.T, d *Dialect) int {
	t.Helper()
	var limit int
	if err := d.DB().QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&limit); err != nil {
		t.Fatal(err)
	}
	if limit > 256<<20 {
		t.Fatalf("max_allowed_packet is %d: too large for this test to publish past it", limit)
	}
	return limit
}

// A message the server would refuse for its max_allowed_packet (the server resets the
// connection) is refused before it is sent, with an error naming the limit, its value and
// the message's size; the pool and the caller's transaction stay usable. A message well
// under the limit is published.
func TestPublishRefusesAMessageOverMaxAllowedPacket(t *testing.T) {
	d := newDialect(t)
	tbl := newTable(t, d, "ra_pkt", leaseTable)
	limit := serverPacketLimit(t, d)
	p, err := d.Publisher(ctx, tbl)
	if err != nil {
		t.Fatal(err)
	}
	headers := []byte(`{"k":"` + strings.Repeat("h", 1000) + `"}`)
	for _, c := range []struct {
		name    string
		payload int
		headers []byte
	}{
		{"payload over the limit", limit + 1, nil},
		{"payload twice the limit", 2 * limit, nil},
		{"payload and headers over the limit", limit - len(headers)/2, headers},
	} {
		m := dialects.Message{Payload: make([]byte, c.payload), Headers: c.headers, Group: "g"}
		size := strconv.Itoa(c.payload + len(c.headers))
		for _, inTx := range []bool{false, true} {
			var tx *sql.Tx
			if inTx {
				if tx, err = d.DB().BeginTx(ctx, nil); err != nil {
					t.Fatal(err)
				}
			}
			var txArg any
			if tx != nil {
				txArg = tx
			}
			_, err := p.Publish(ctx, txArg, m)
			if err == nil {
				t.Fatalf("%s (tx %v): published", c.name, inTx)
			}
			msg := err.Error()
			if !strings.Contains(msg, "max_allowed_packet") || !strings.Contains(msg, strconv.Itoa(limit)) || !strings.Contains(msg, size) {
				t.Fatalf("%s (tx %v): %v\nwant an error naming max_allowed_packet, its value %d and the message's %s bytes", c.name, inTx, err, limit, size)
			}
			if tx != nil {
				// The transaction is still the caller's, on a live connection.
				if _, err := p.Publish(ctx, tx, dialects.Message{Payload: []byte("small"), Group: "g"}); err != nil {
					t.Fatalf("%s: a small publish in the same transaction: %v", c.name, err)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if n := count(t, d.DB(), "SELECT COUNT(*) FROM "+quote(tbl.Name)); n != 0 {
		t.Fatalf("%d rows written", n)
	}
	// Well under the limit (the statement's own bytes aside) is published.
	big := limit - len(headers) - 8<<10
	id, err := p.Publish(ctx, nil, dialects.Message{Payload: make([]byte, big), Headers: headers, Group: "g"})
	if err != nil {
		t.Fatalf("a %d-byte payload under max_allowed_packet %d: %v", big, limit, err)
	}
	var n int
	if err := d.DB().QueryRowContext(ctx, "SELECT LENGTH(payload) FROM "+quote(tbl.Name)+" WHERE id = ?", id).Scan(&n); err != nil || n != big {
		t.Fatalf("stored %d bytes (%v), want %d", n, err, big)
	}
}
