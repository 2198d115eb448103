// Package sqlpart holds pieces of SQL the three dialects share in their claim and
// settlement statements:
//
//   - the saturating attempt count and its give-back (CountAttempt, UncountAttempt),
//   - the error column's assignment (KeepError),
//   - a subscription's event SQL compiled into a dialect's placeholders (CompileEvent),
//   - the due probe's chunking and result reader (ProbeGroups, ReadDue).
//
// Only the dialects of this module use it; it is not part of rowactor's API.
package sqlpart
