// Package supervision decides what happens to a rowactor actor that fails, and when.
//
// Proto.Actor restarts a failed child at once, and its "exponential" strategy is linear
// and uncapped. A claimer whose database is down must not spin: Backoff restarts it after
// a delay that doubles with each failure in a window, capped and jittered so that many
// subscriptions that lost one database do not come back in step.
//
// # Contract
//
// Package supervision is part of rowactor's engine, used by the root package
// (github.com/rowactor/rowactor) for its default restart policy, by package actors for
// the claimers and renewers it supervises, and by package outbox for its relay. Nothing
// here has a compatibility promise; it may change in any release. Programs use the root
// package.
//
// Backoff is a Proto.Actor supervisor strategy, and its Decide and OnRestart hooks take
// the failed child's *actor.PID. They are exported only for the parent actors in
// packages actors and outbox.
package supervision
