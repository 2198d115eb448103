package actors

import (
	"testing"
	"unsafe"
)

// A delivery is allocated per claimed row, and the GC's work grows with the bytes
// allocated: at 1,608 bytes it took the allocator's 1,792-byte class, at 1,272 the
// 1,280-byte one, 512 bytes less per row (SQLite lease drain: an eighth of the bytes
// allocated). A field added to delivery that crosses the class fails here: make room
// for it (a pointer to what few deliveries use, as stopResult is), or say in the
// benchmarks what it costs and raise the bound.
func TestADeliveryFitsTheAllocatorsClassOf1280Bytes(t *testing.T) {
	if size := unsafe.Sizeof(delivery{}); size > 1280 {
		t.Fatalf("a delivery is %d bytes; it must fit the allocator's 1,280-byte size class", size)
	}
}
