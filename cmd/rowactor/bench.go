package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The benchmark harness is package main under bench/ (go run ./bench): it is not built
// into this binary, and moving it would fork it. So bench builds the harness from the
// source tree it finds around the working directory and runs it, and says so when there
// is no tree.

// modulePath is rowactor's module, whose source tree holds the harness.
const modulePath = "github.com/rowactor/rowactor"

var benchCommand = &command{
	name:    "bench",
	summary: "run the benchmark harness (needs rowactor's source tree)",
	help: `Usage: rowactor bench [harness flags]

Runs rowactor's benchmark harness, which drains a queue table next to a hand-written
loop running the same SQL, and prints JSON lines (docs/benchmarks.md describes it).

The harness is package main in rowactor's source tree (bench/), not part of this binary:
bench looks for the tree around the working directory (the directory holding go.mod of
` + modulePath + `), builds the harness there with the go command (into a temporary
directory, removed afterwards) and runs it here with the flags given. So it needs a
checkout and the go command. Its exit status is the harness's.

Examples (inside a checkout of ` + modulePath + `):
  rowactor bench -db sqlite -form lease -workers 1,8 -rows 20000 -rounds 3
  rowactor bench -db postgres -form lease,rowlock,advisory -workers 1,8 -tracing both
  rowactor bench -- -h          # the harness's own flags
`,
}

func init() { benchCommand.run = runBench }

func runBench(ctx context.Context, e *env, args []string) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(e.stdout, benchCommand.help)
		return errHelpShown
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := moduleRoot(wd)
	if err != nil {
		return err
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the harness is built with the go command, which is not on PATH: %w", err)
	}
	dir, err := os.MkdirTemp("", "rowactor-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// Built, then run here rather than with go run: the harness's exit status comes back
	// as is, and its relative paths (-cpuprofile, -dir) are the caller's.
	bin := filepath.Join(dir, "bench")
	build := exec.CommandContext(ctx, goTool, "build", "-o", bin, "./bench")
	build.Dir, build.Stdout, build.Stderr = root, e.stderr, e.stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build the harness in %s: %w", root, err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.stdout, e.stderr
	// Ctrl-C interrupts the harness rather than killing it, so it can clean up.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	err = cmd.Run()
	var x *exec.ExitError
	if errors.As(err, &x) && x.ExitCode() > 0 {
		return &exitStatus{code: x.ExitCode()}
	}
	return err
}

// errNoSourceTree is bench run away from rowactor's source tree.
var errNoSourceTree = errors.New("the benchmark harness is package main in rowactor's source tree (bench/), not part of this binary: " +
	"run 'rowactor bench' inside a checkout of " + modulePath + " (git clone https://" + modulePath + "), or 'go run ./bench' there")

// moduleRoot finds the directory, dir or above, whose go.mod declares rowactor's module
// and which holds the harness.
func moduleRoot(dir string) (string, error) {
	for {
		if isRowactorModule(filepath.Join(dir, "go.mod")) {
			if _, err := os.Stat(filepath.Join(dir, "bench", "main.go")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errNoSourceTree
		}
		dir = parent
	}
}

// isRowactorModule reports whether the go.mod at path declares rowactor's module.
func isRowactorModule(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`) == modulePath
		}
	}
	return false
}
