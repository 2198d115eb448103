package sqlite

import (
	"context"
	"sync"
)

// file is what this process shares about one database file across every Dialect opened
// on it: the writer turn and the advisory keys in work. SQLite has no session locks, so
// the keys live here; two Dialects (two brokers) on one file therefore exclude each
// other, but two processes do not see each other's keys.
type file struct {
	// writer is a one-slot semaphore rather than a sync.Mutex so a waiting writer can
	// give up with its context. Serialising this process's writes keeps them from
	// spinning in SQLite's busy handler against each other; busy_timeout still covers
	// writers in other processes.
	writer chan struct{}

	mu   sync.Mutex
	keys map[string]struct{}
}

// Entries are never removed: they are a few words each, and a Dialect closing must not
// split the registry for another Dialect (or a session still in work) on the same file.
var files struct {
	mu sync.Mutex
	m  map[string]*file
}

func fileFor(path string) *file {
	files.mu.Lock()
	defer files.mu.Unlock()
	if files.m == nil {
		files.m = make(map[string]*file)
	}
	f := files.m[path]
	if f == nil {
		f = &file{writer: make(chan struct{}, 1), keys: make(map[string]struct{})}
		files.m[path] = f
	}
	return f
}

// lockWriter waits for this process's write turn on the file.
func (f *file) lockWriter(ctx context.Context) error {
	select {
	case f.writer <- struct{}{}:
		return nil
	default:
	}
	select {
	case f.writer <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *file) unlockWriter() { <-f.writer }

func (f *file) tryKey(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, held := f.keys[key]; held {
		return false
	}
	f.keys[key] = struct{}{}
	return true
}

func (f *file) releaseKey(key string) {
	f.mu.Lock()
	delete(f.keys, key)
	f.mu.Unlock()
}

func (f *file) keyHeld(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, held := f.keys[key]
	return held
}

func (f *file) heldKeys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, 0, len(f.keys))
	for k := range f.keys {
		keys = append(keys, k)
	}
	return keys
}
