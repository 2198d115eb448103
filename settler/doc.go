// Package settler turns a handler's outcome into the settlement statement the claim form
// calls for, and runs it where the form says: with the lease token (lease form) or on the
// session that holds the key (advisory form).
//
// The backoff of a failed delivery (Fail) is the subscription's policy (Rules.Backoff);
// Retry and RetryAfter keep the handler's own choice. Delays never leave the database.
//
// # Contract
//
// Package settler is part of rowactor's engine, used by the root package
// (github.com/rowactor/rowactor), which builds its outcomes and rules, and by package
// actors, which settles every delivery through it. Nothing here has a compatibility
// promise; it may change in any release. Programs use the root package.
package settler
