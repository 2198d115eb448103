#!/usr/bin/env bash
# scripts/complexity.sh - fail when a library function is above cyclomatic complexity 25.
#
# "Library" is every package a program imports: the root package, the engine packages,
# dialects and the test kits, but not package main (cmd/, bench/, examples/) and not
# _test.go files. gocyclo counts 1 + each if, for, case, && and ||; pinned like
# staticcheck so the number does not move under us.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
limit=${1:-25}
# gocyclo exits 1 when it prints a function, so its output decides; an exit without
# output (the tool could not be fetched or built) is an error of its own. The awk keeps
# any main package outside bench/, examples/ and cmd/ out as well.
set +e
out=$(go run github.com/fzipp/gocyclo/cmd/gocyclo@v0.6.0 -over "$limit" -ignore '_test\.go$|^(bench|examples|cmd)/' . 2>&1)
rc=$?
set -e
if [ "$rc" -ne 0 ] && ! printf '%s\n' "$out" | grep -qE '^[0-9]+ '; then
  echo "gocyclo did not run (exit $rc):"
  echo "$out"
  exit 1
fi
over=$(printf '%s\n' "$out" | grep -E '^[0-9]+ ' | awk '$2 != "main"' || true)
if [ -n "$over" ]; then
  echo "these library functions are above cyclomatic complexity $limit; split them into named steps:"
  echo "$over"
  exit 1
fi
echo "no library function above cyclomatic complexity $limit"
