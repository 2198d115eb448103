// Package adminsql holds what the three dialects share to serve the operator's
// interfaces of package dialects: Admin, Inspector, JobLister, JobController,
// FinishedCounter and the dead-letter move.
//
// It builds the statements' text from a table's description, scans their results, and
// checks a requeue or a job change before a dialect runs it. Each dialect quotes
// identifiers and binds values its own way, so the functions here take those as
// arguments.
//
// Only the dialects of this module use it; it is not part of rowactor's API.
package adminsql
