// Package claimer takes rows from a queue table.
//
// A claimer actor runs one claim at a time for its subscription: asked for up to n rows,
// it claims them in the table's form and answers with what it took. When the database
// fails it reports the failure to its parent and fails itself, so that its supervisor
// restarts it after a capped, jittered backoff: a claimer never spins on a dead database.
// It keeps no state worth keeping across a restart; the subscription actor above it
// counts the deliveries in work.
//
// # Contract
//
// Package claimer is part of rowactor's engine, used by the root package
// (github.com/rowactor/rowactor) through package actors: each subscription actor spawns
// and supervises its claimers. Nothing here has a compatibility promise; it may change in
// any release. Programs use the root package.
//
// Props, Config.Dispatcher, Request and Claimed name Proto.Actor types or are Proto.Actor
// messages. They are exported only for the subscription actor in package actors.
package claimer
