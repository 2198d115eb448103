// Package leaserenewer keeps the leases of a lease-form subscription alive.
//
// The Book records each lease in work: one Held per claim, identified by its row and the
// token its claim wrote, never by the row alone. A renewer actor extends every live lease
// in the book each half lease, in one statement, and moves each token forward; a delivery
// pins its lease to settle, waiting for an extension of it that is in flight, so a
// settlement never races the renewer with a stale token.
//
// A row can be claimed again while a delivery of it still runs (its lease ran out: the
// renewer lagged, the database was slow, the process paused). The new claim's lease
// replaces the old one as the row's current lease, and the old one is lost for good: its
// delivery settles with its own token, finds the row under another, and changes nothing.
//
// # Contract
//
// Package leaserenewer is part of rowactor's engine, used by the root package
// (github.com/rowactor/rowactor) through package actors, which spawns a renewer for each
// lease-form subscription; package claimer dates its claims' leases with Expiry, and
// dialects/dialecttest drives a renewer to test the dialects. Nothing here has a
// compatibility promise; it may change in any release. Programs use the root package.
//
// Props, Config.Dispatcher and RenewNow name Proto.Actor types or are Proto.Actor
// messages. They are exported only for package actors and for dialects/dialecttest.
package leaserenewer
