package rowactor_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/rowactor/rowactor"
)

// On MariaDB and MySQL a payload past the server's max_allowed_packet is refused before
// it is sent, with an error naming the limit, its value and the payload's size (the
// server would reset the connection instead); the broker goes on publishing.
func TestPublishPastMaxAllowedPacketSaysSo(t *testing.T) {
	t.Parallel()
	h := newHarness(t, driverNamed(t, "mysql"), rowactor.FormLease)
	var limit int
	if err := mysqlDB(h.d).QueryRowContext(context.Background(), "SELECT @@max_allowed_packet").Scan(&limit); err != nil {
		t.Fatal(err)
	}
	if limit > 256<<20 {
		t.Fatalf("max_allowed_packet is %d: too large for this test to publish past it", limit)
	}
	b := h.broker()
	_, err := b.Publish(context.Background(), h.table, h.queue, make([]byte, limit+1))
	if err == nil {
		t.Fatalf("a %d-byte payload was published past max_allowed_packet %d", limit+1, limit)
	}
	if msg := err.Error(); !strings.Contains(msg, "max_allowed_packet") || !strings.Contains(msg, strconv.Itoa(limit)) ||
		!strings.Contains(msg, "payload "+strconv.Itoa(limit+1)) {
		t.Fatalf("Publish: %v\nwant an error naming max_allowed_packet, its value %d and the payload's %d bytes", err, limit, limit+1)
	}
	h.publish(b, 1)
	if n := h.drv.count(t, h.d, fmt.Sprintf("SELECT COUNT(*) FROM %s", h.table.Name)); n != 1 {
		t.Fatalf("%d rows, want the small publish's alone", n)
	}
}
