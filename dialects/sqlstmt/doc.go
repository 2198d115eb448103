// Package sqlstmt keeps the prepared statements of a database/sql dialect (SQLite, MySQL):
// each statement text is prepared once per pool, so a subscription's statements, built
// once, are also parsed once, and a statement the live schema cannot run fails when the
// subscription starts rather than at its first settlement.
//
// # Contract
//
// Package sqlstmt is part of rowactor's engine, used by the database/sql dialects
// (dialects/sqlite and dialects/mysql), which the root package
// (github.com/rowactor/rowactor) drives through the interfaces of package dialects.
// Nothing here has a compatibility promise; it may change in any release. Programs use
// the root package.
package sqlstmt
