// Package history is the run history under data_dir: the soak runs and
// canary rounds imcanary recorded, kept within bounds, and written so that
// a crash never leaves half a record. One process writes a data_dir at a
// time (Acquire); a Store still sees runs that others put there. It keeps
// report values (report.Soak, report.Round) and gives them back.
package history

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/imcanary/imcanary/metrics"
	"github.com/imcanary/imcanary/report"
)

// ErrNotFound is returned for an id that names no run in the history,
// including one that could never name a run ("../x", "a/b", "").
var ErrNotFound = errors.New("run not found")

// Defaults for the zero Options.
const (
	DefaultMaxRuns = 100
	// DefaultMaxCanaryRounds is a week of rounds at one a minute.
	DefaultMaxCanaryRounds = 7 * 24 * 60
)

const (
	runsDir    = "runs"
	canaryFile = "canary.jsonl"
	// Files being written start with tempPrefix, so that no reader takes
	// one for a run, and one left by a crash can be recognised.
	tempPrefix       = ".tmp-"
	canaryTempPrefix = tempPrefix + canaryFile + "-"
	// strayAfter is how old a temp file (or an earlier version's report
	// page without its JSON) must be before pruning deletes it. A writer
	// in another process, such as a one-off soak run sharing the data
	// directory, finishes a file in far less; a minute leaves it alone.
	strayAfter = time.Minute
	maxIDLen   = 128
	// tailChunk is how much of canary.jsonl is read at a time from its
	// end: a few hundred rounds, enough for the status page in one read.
	tailChunk = 64 << 10
)

// Options bound the run history.
type Options struct {
	// MaxRuns is how many soak runs are kept, the oldest deleted first;
	// zero means DefaultMaxRuns.
	MaxRuns int
	// MaxAge deletes soak runs that started longer ago; zero keeps runs
	// until MaxRuns pushes them out.
	MaxAge time.Duration
	// MaxCanaryRounds bounds canary.jsonl. When it grows past this many
	// lines it is rewritten with the newest half, so that it is rewritten
	// once every MaxCanaryRounds/2 rounds rather than on every round. Zero
	// means DefaultMaxCanaryRounds.
	MaxCanaryRounds int
	// Now is the clock that ages runs and stray files; time.Now when nil.
	Now func() time.Time
}

// Store is the run history under a data directory: soak runs as
// runs/<id>.json and canary rounds as lines of canary.jsonl. It stores
// reports, not pages: the daemon renders a run's page from its JSON when
// it is asked for one. Versions before this one also wrote the page, as
// runs/<id>.html; pruning deletes those with their run, so a data
// directory they wrote stays bounded. Every file is either appended to and fsynced
// or written whole to a temp file and renamed, so a crash at any moment
// leaves the history readable. It is safe for concurrent use.
type Store struct {
	dir, runs string
	o         Options

	// mu serialises writers and guards what follows. Readers of a single
	// file (Soak, CanaryRounds) do not take it: renames are
	// atomic and a partly appended line is skipped.
	mu sync.Mutex
	// index holds the runs in runs/, ordered by start time, oldest first.
	// Pruning keeps it within MaxRuns entries, so Runs never rereads the
	// reports it has already seen.
	index []entry
	// canaryLines counts the lines of canary.jsonl, damaged ones included,
	// to know when to rotate it.
	canaryLines int
	// canaryTorn is set when canary.jsonl may end in a partial line (a
	// crash or failed write mid-append), so the next append starts on a
	// line of its own instead of gluing onto the fragment.
	canaryTorn bool
}

// entry is a run in the index. A report that cannot be read is kept as a
// damaged entry, aged by its file's modification time, so that it counts
// against MaxRuns and is eventually pruned, but is never listed.
type entry struct {
	report.RunSummary
	damaged error
}

// Open opens the run history under dir, creating dir/runs if needed,
// and prunes it: runs beyond the bounds and temp files left by a crash.
func Open(dir string, o Options) (*Store, error) {
	if dir == "" {
		return nil, errors.New("run history: no data directory")
	}
	if o.MaxRuns <= 0 {
		o.MaxRuns = DefaultMaxRuns
	}
	if o.MaxCanaryRounds <= 0 {
		o.MaxCanaryRounds = DefaultMaxCanaryRounds
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Store{dir: dir, runs: filepath.Join(dir, runsDir), o: o}
	if err := os.MkdirAll(s.runs, 0o755); err != nil {
		return nil, fmt.Errorf("run history: %w", err)
	}
	var err error
	if s.canaryLines, s.canaryTorn, err = countLines(s.canaryPath()); err != nil {
		return nil, fmt.Errorf("run history: %w", err)
	}
	// The index comes first: recording an aborted run prunes, and pruning
	// tells an earlier version's stray page from a run's by the index.
	s.mu.Lock()
	_, err = s.refresh()
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := s.recoverAborted(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	des, err := s.refresh()
	if err != nil {
		return nil, err
	}
	if err := s.prune(des); err != nil {
		return nil, err
	}
	return s, nil
}

// runningSuffix names the marker of a run in progress: runs/ID.running holds
// its report as it began (id, profile, start), written by BeginSoak and
// removed by SaveSoak.
const runningSuffix = ".running"

// BeginSoak marks r, a run that has just started, as in progress, so that
// if the process dies before SaveSoak (kill -9, a crash, the machine going
// down) the next Open records the run as aborted instead of losing it.
func (s *Store) BeginSoak(r *report.Soak) error {
	if !validID(r.ID) {
		return fmt.Errorf("begin run: invalid id %q", r.ID)
	}
	var js bytes.Buffer
	if err := report.WriteJSON(&js, r); err != nil {
		return fmt.Errorf("begin run %s: %w", r.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := writeAtomic(filepath.Join(s.runs, r.ID+runningSuffix), js.Bytes()); err != nil {
		return fmt.Errorf("begin run: %w", err)
	}
	return syncDir(s.runs)
}

// recoverAborted saves, as aborted, each run whose marker outlived its
// process; a marker whose run was saved (a crash between the two) is
// removed, and so is one that cannot be read.
func (s *Store) recoverAborted() error {
	des, err := os.ReadDir(s.runs)
	if err != nil {
		return fmt.Errorf("run history: %w", err)
	}
	var errs []error
	for _, de := range des {
		id, ok := strings.CutSuffix(de.Name(), runningSuffix)
		if !ok || !validID(id) || !de.Type().IsRegular() {
			continue
		}
		marker := filepath.Join(s.runs, de.Name())
		if _, err := os.Stat(filepath.Join(s.runs, id+".json")); err == nil {
			errs = append(errs, removeFile(marker))
			continue
		}
		r, err := readReportFile(marker)
		if err != nil || r.ID != id || r.Start.IsZero() {
			// BeginSoak writes atomically: only a hand-edited file gets
			// here, and it names no run that could be recorded.
			errs = append(errs, removeFile(marker))
			continue
		}
		found := s.o.Now()
		r.Result = metrics.ResultAborted
		r.End = found
		r.Notes = append(r.Notes, fmt.Sprintf("imcanary stopped during this run without finishing it (killed, crashed, or its machine went down); "+
			"the next start found it at %s. Nothing after the run's start was recorded, so it has no counts.", found.UTC().Format(time.RFC3339)))
		if err := s.SaveSoak(r); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("run history: %w", err)
	}
	return nil
}

func readReportFile(path string) (*report.Soak, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return report.ReadJSON(f)
}

func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (s *Store) canaryPath() string { return filepath.Join(s.dir, canaryFile) }

// validID reports whether id can name a run: it becomes a file name, so
// only letters, digits, '_' and '-' are allowed, which rules out '/', '.'
// and with them every path trick.
func validID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for _, c := range []byte(id) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// SaveSoak records a soak run as runs/<id>.json. Saving a run with the id
// of one already saved replaces it. It then prunes the history; an error
// from pruning says the run itself was saved.
func (s *Store) SaveSoak(r *report.Soak) error {
	if !validID(r.ID) {
		return fmt.Errorf("save run: invalid id %q", r.ID)
	}
	if r.Start.IsZero() {
		// Runs are ordered and aged by their start: without one, the run
		// would be pruned as the oldest straight away.
		return fmt.Errorf("save run %s: no start time", r.ID)
	}
	// Encoded before taking the lock: a long run has many samples, and
	// the status page should not wait for them.
	var js bytes.Buffer
	if err := report.WriteJSON(&js, r); err != nil {
		return fmt.Errorf("save run %s: %w", r.ID, err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	base := filepath.Join(s.runs, r.ID)
	if err := writeAtomic(base+".json", js.Bytes()); err != nil {
		return fmt.Errorf("save run: %w", err)
	}
	if err := syncDir(s.runs); err != nil {
		return fmt.Errorf("save run: %w", err)
	}
	if err := removeFile(base + runningSuffix); err != nil {
		return fmt.Errorf("save run: %w", err)
	}
	s.index = slices.DeleteFunc(s.index, func(e entry) bool { return e.ID == r.ID })
	s.index = append(s.index, entry{RunSummary: r.Summary()})
	sortIndex(s.index)
	// A page an earlier version wrote for a run of this id no longer
	// shows it.
	if err := removeFile(base + ".html"); err != nil {
		return fmt.Errorf("run %s saved, but removing its outdated page failed: %w", r.ID, err)
	}

	des, err := os.ReadDir(s.runs)
	if err == nil {
		err = s.prune(des)
	}
	if err != nil {
		return fmt.Errorf("run %s saved, but pruning the history failed: %w", r.ID, err)
	}
	return nil
}

// SaveCanary appends a canary round to canary.jsonl and fsyncs it. When
// the file grows past MaxCanaryRounds lines it is rewritten, atomically,
// with the newest MaxCanaryRounds/2.
func (s *Store) SaveCanary(c *report.Round) error {
	line, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("save canary round: %w", err)
	}
	line = append(line, '\n')

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.canaryTorn {
		// End the fragment; readers skip it as the damaged line it is.
		line = append([]byte{'\n'}, line...)
	}
	path := s.canaryPath()
	created := s.canaryLines == 0
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("save canary round: %w", err)
	}
	_, werr := f.Write(line)
	if werr == nil {
		werr = f.Sync()
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		// Part of the line may have reached the file.
		s.canaryTorn = true
		return fmt.Errorf("save canary round: %w", werr)
	}
	s.canaryTorn = false
	s.canaryLines += bytes.Count(line, []byte{'\n'})
	if created {
		if err := syncDir(s.dir); err != nil {
			return fmt.Errorf("save canary round: %w", err)
		}
	}
	if s.canaryLines > s.o.MaxCanaryRounds {
		if err := s.rotateCanary(); err != nil {
			return fmt.Errorf("canary round saved, but rotating %s failed: %w", path, err)
		}
	}
	return nil
}

// rotateCanary rewrites canary.jsonl with its newest MaxCanaryRounds/2
// rounds, dropping damaged lines. The lines are copied as they are, so
// fields this version does not know survive.
func (s *Store) rotateCanary() error {
	keep := max(s.o.MaxCanaryRounds/2, 1)
	var lines [][]byte
	err := eachLineBackward(s.canaryPath(), tailChunk, keep, func(l []byte) bool {
		var c report.Round
		if json.Unmarshal(l, &c) != nil {
			return false
		}
		lines = append(lines, bytes.Clone(l))
		return true
	})
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	for _, l := range slices.Backward(lines) {
		buf.Write(l)
		buf.WriteByte('\n')
	}
	if err := writeAtomic(s.canaryPath(), buf.Bytes()); err != nil {
		return err
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	s.canaryLines, s.canaryTorn = len(lines), false
	return nil
}

// Runs returns up to limit soak runs, newest first; limit ≤ 0 means all.
// Reports that cannot be read are left out.
func (s *Store) Runs(limit int) ([]report.RunSummary, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.refresh(); err != nil {
		return nil, err
	}
	out := []report.RunSummary{}
	for _, e := range slices.Backward(s.index) {
		if limit > 0 && len(out) >= limit {
			break
		}
		if e.damaged == nil {
			out = append(out, e.RunSummary)
		}
	}
	return out, nil
}

// Soak returns the report of the run id. It returns ErrNotFound for an id
// that names no run, and an error naming the file when the report cannot
// be read.
func (s *Store) Soak(id string) (*report.Soak, error) {
	return readReport(s.runs, id, report.ReadJSON)
}

// readReport reads the report id from dir/id.json with read: ErrNotFound
// for an id that names no file there (or could not name one), an error
// naming the file for one that cannot be read.
func readReport[T any](dir, id string, read func(io.Reader) (*T, error)) (*T, error) {
	if !validID(id) {
		return nil, ErrNotFound
	}
	path := filepath.Join(dir, id+".json")
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("run history: %w", err)
	}
	defer f.Close()
	r, err := read(f)
	if err != nil {
		return nil, fmt.Errorf("run history: %s: %w", path, err)
	}
	return r, nil
}

// CanaryRounds returns up to limit canary rounds, newest first; limit ≤ 0
// means all. Damaged lines, such as one cut short by a crash, are skipped.
// It reads canary.jsonl from its end, so a short listing costs the same
// however long the file is.
func (s *Store) CanaryRounds(limit int) ([]report.Round, error) {
	out := []report.Round{}
	err := eachLineBackward(s.canaryPath(), tailChunk, limit, func(l []byte) bool {
		var c report.Round
		if json.Unmarshal(l, &c) != nil {
			return false
		}
		out = append(out, c)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("run history: %w", err)
	}
	return out, nil
}

// refresh brings the index in line with runs/: it loads reports it has
// not seen (saved by another process sharing the data directory) and
// forgets those deleted. It returns the directory listing for prune.
// s.mu must be held.
func (s *Store) refresh() ([]fs.DirEntry, error) {
	des, err := os.ReadDir(s.runs)
	if err != nil {
		return nil, fmt.Errorf("run history: %w", err)
	}
	onDisk := make(map[string]fs.DirEntry)
	for _, de := range des {
		if id, ok := strings.CutSuffix(de.Name(), ".json"); ok && validID(id) && de.Type().IsRegular() {
			onDisk[id] = de
		}
	}
	index := make([]entry, 0, len(onDisk))
	known := make(map[string]bool, len(s.index))
	for _, e := range s.index {
		if onDisk[e.ID] != nil {
			index = append(index, e)
			known[e.ID] = true
		}
	}
	added := false
	for id, de := range onDisk {
		if !known[id] {
			index = append(index, s.load(id, de))
			added = true
		}
	}
	if added {
		sortIndex(index)
	}
	s.index = index
	return des, nil
}

// load reads the report id for the index.
func (s *Store) load(id string, de fs.DirEntry) entry {
	path := filepath.Join(s.runs, de.Name())
	e := entry{RunSummary: report.RunSummary{ID: id}}
	if info, err := de.Info(); err == nil {
		e.Start = info.ModTime()
	}
	f, err := os.Open(path)
	if err != nil {
		e.damaged = err
		return e
	}
	defer f.Close()
	r, err := report.ReadJSON(f)
	if err != nil {
		e.damaged = fmt.Errorf("%s: %w", path, err)
		return e
	}
	if r.Start.IsZero() {
		r.Start = e.Start
	}
	r.ID = id
	return entry{RunSummary: r.Summary()}
}

// prune deletes the runs beyond MaxRuns or older than MaxAge, and the
// files a crash left behind once they are older than strayAfter. des is
// a listing of runs/. s.mu must be held.
func (s *Store) prune(des []fs.DirEntry) error {
	now := s.o.Now()
	var errs []error
	remove := func(path string) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// A pinned baseline is kept whatever its age, and does not count
	// towards max_runs: later runs are compared with it, so pruning it
	// would end the comparison the user asked for. Unreadable pins keep
	// nothing, and say so.
	pins, err := s.readPins()
	if err != nil {
		errs = append(errs, err)
	}
	pinned := make(map[string]bool, len(pins))
	for _, p := range pins {
		pinned[p.ID] = true
	}
	left := 0
	for _, e := range s.index {
		if !pinned[e.ID] {
			left++
		}
	}
	// The index is oldest first, so both bounds cut off a prefix of the
	// runs that are not pinned.
	keep := make([]entry, 0, len(s.index))
	done := false
	for _, e := range s.index {
		if done || pinned[e.ID] {
			keep = append(keep, e)
			continue
		}
		tooMany := left > s.o.MaxRuns
		tooOld := s.o.MaxAge > 0 && now.Sub(e.Start) > s.o.MaxAge
		if !tooMany && !tooOld {
			done = true
			keep = append(keep, e)
			continue
		}
		left--
		base := filepath.Join(s.runs, e.ID)
		// The JSON goes first: without it the run no longer exists, so a
		// crash in between leaves a stray page, not a run without one.
		// The page is an earlier version's (see Store).
		remove(base + ".json")
		remove(base + ".html")
	}
	s.index = keep

	live := make(map[string]bool, len(s.index))
	for _, e := range s.index {
		live[e.ID] = true
	}
	stale := func(de fs.DirEntry) bool {
		info, err := de.Info()
		return err == nil && now.Sub(info.ModTime()) > strayAfter
	}
	// An earlier version's page without its JSON is from a save of that
	// version that never finished, or a run deleted by hand.
	for _, de := range des {
		name := de.Name()
		id, isPage := strings.CutSuffix(name, ".html")
		switch {
		case strings.HasPrefix(name, tempPrefix) && stale(de):
			remove(filepath.Join(s.runs, name))
		case isPage && validID(id) && !live[id] && stale(de):
			remove(filepath.Join(s.runs, name))
		}
	}
	top, err := os.ReadDir(s.dir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, de := range top {
		// Only our own temp files: the data directory may hold others'.
		if strings.HasPrefix(de.Name(), canaryTempPrefix) && stale(de) {
			remove(filepath.Join(s.dir, de.Name()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("run history: %w", err)
	}
	return nil
}

func sortIndex(index []entry) {
	slices.SortFunc(index, func(a, b entry) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// writeAtomic writes data to path through a temp file in the same
// directory, fsynced before it is renamed over path. The caller syncs the
// directory.
func writeAtomic(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	// CreateTemp makes the file 0600; history files are as readable as
	// the status page that serves them.
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// syncDir makes the renames and creations in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// countLines counts the lines of the file at path, a final unterminated
// one included, and reports whether it ends in such a fragment. A missing
// file has none.
func countLines(path string) (n int, torn bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	buf := make([]byte, tailChunk)
	var last byte = '\n'
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n += bytes.Count(buf[:k], []byte{'\n'})
			last = buf[k-1]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, false, err
		}
	}
	if last != '\n' {
		return n + 1, true, nil
	}
	return n, false, nil
}

// eachLineBackward calls fn with the non-empty lines of the file at path,
// last first, reading chunk bytes at a time from its end, until fn has accepted limit of them (limit ≤ 0: all). A
// final line without its newline, perhaps still being appended, is passed
// too; fn rejects what it cannot parse. The line is only valid during the
// call. A missing file has no lines.
func eachLineBackward(path string, chunk int64, limit int, fn func(line []byte) bool) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	accepted := 0
	off := info.Size()
	// carry is the start of the line that the previous chunk began in the
	// middle of; it is completed by the chunk before it.
	var carry []byte
	for off > 0 {
		n := min(chunk, off)
		off -= n
		buf := make([]byte, int(n)+len(carry))
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			return err
		}
		copy(buf[n:], carry)
		first := 0
		if off > 0 {
			// Everything before the first newline belongs to a line
			// that starts in an earlier chunk.
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				carry = buf
				continue
			}
			first = i + 1
			carry = buf[:i]
		}
		for end := len(buf); end > first; {
			start := first + bytes.LastIndexByte(buf[first:end], '\n') + 1
			if line := buf[start:end]; len(line) > 0 && fn(line) {
				accepted++
				if limit > 0 && accepted >= limit {
					return nil
				}
			}
			end = start - 1
		}
	}
	return nil
}
