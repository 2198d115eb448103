// Package tablecheck holds the checks the three dialects run on a table's description
// when a queue, publisher, outbox or dashboard count opens: which columns must exist,
// which forms and orders the table can serve, and whether a priority range fits its
// column type.
//
// Each check returns nil or a *dialects.ConfigError that names the table and the fix.
//
// Only the dialects of this module use it; it is not part of rowactor's API.
package tablecheck
