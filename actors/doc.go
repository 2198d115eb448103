// Package actors is rowactor's actor tree.
//
// Each subscription is one subscription actor. It supervises a claimer (restarted with
// backoff when its database fails), a lease renewer (lease form), and one delivery actor
// per claimed row, and it keeps up to Workers deliveries in work. A delivery actor runs
// its handler on a goroutine of its own, so that it can still be stopped while a handler
// runs, and settles the outcome where the form says. In the advisory form the delivery
// actor is its key's connection owner: it holds the session with the key locked and
// settles on it.
//
// Proto.Actor's ActorSystem.Shutdown does not stop actors, so rowactor stops its own:
// Drain stops claiming and reports when the last delivery settled; stopping a
// subscription actor releases every row still in work.
//
// # Contract
//
// Package actors is part of rowactor's engine. The root package
// (github.com/rowactor/rowactor) starts and stops its subscriptions through it, and
// package outbox borrows its relay's actor system with TakeSystem. Nothing here has a
// compatibility promise; it may change in any release. Programs use the root package.
//
// System, Start and Dispatcher name Proto.Actor types. They stay in the API because
// the root package needs them: a broker runs its subscriptions on an actor system of its
// own, or on the one given to rowactor.WithActorSystem.
package actors
