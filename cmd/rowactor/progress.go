package main

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// progress tells a requeue's progress on stderr once it runs to more than one chunk: a
// bar redrawn in place on a terminal, and otherwise (a log, a pipe) a line per tenth of
// the rows, so a long requeue logs ten lines, not thousands.
type progress struct {
	w     io.Writer
	tty   bool
	chunk int
	// shown is the tenths already logged (lines), or whether a bar is on screen (tty).
	shown int
}

const barWidth = 30

func newProgress(w io.Writer, chunk int) *progress {
	return &progress{w: w, tty: isTerminal(w), chunk: chunk}
}

// update is the dialect's progress callback: done of total rows moved so far.
func (p *progress) update(done, total int) {
	if total <= p.chunk || total == 0 {
		return
	}
	if p.tty {
		filled := done * barWidth / total
		fmt.Fprintf(p.w, "\r[%s%s] %d/%d", strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled), done, total)
		p.shown = 1
		return
	}
	if tenth := done * 10 / total; tenth > p.shown || done == total {
		p.shown = tenth
		fmt.Fprintf(p.w, "requeue: %d/%d rows moved (not committed yet)\n", done, total)
	}
}

// end finishes the bar's line.
func (p *progress) end() {
	if p.tty && p.shown > 0 {
		fmt.Fprintln(p.w)
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
