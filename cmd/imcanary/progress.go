package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/imcanary/imcanary/soak"
)

// progressPrinter shows a soak run's progress: one redrawn line on a
// terminal, a plain line every few seconds elsewhere (CI logs).
type progressPrinter struct {
	w        io.Writer
	terminal bool
	last     time.Time
	drawn    bool
}

func newProgressPrinter(w io.Writer) *progressPrinter {
	p := &progressPrinter{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.terminal = true
		}
	}
	return p
}

// print shows pr as soak.Progress formats it: the line says when loss is
// judged, so that "lost 0" early in a run is not read as no loss.
func (p *progressPrinter) print(pr soak.Progress) {
	line := pr.String()
	if p.terminal {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.drawn = true
		return
	}
	if time.Since(p.last) >= 5*time.Second {
		fmt.Fprintln(p.w, line)
		p.last = time.Now()
	}
}

func (p *progressPrinter) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}
