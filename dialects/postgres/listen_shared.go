package postgres

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
)

// listeners holds the process's shared listening sessions by connection string.
var listeners struct {
	sync.Mutex
	m map[string]*sharedListener
}

// A sharedListener is one listening session and the wakes of every Listen on it. It
// closes its session when the last one leaves.
type sharedListener struct {
	key    string
	cancel context.CancelFunc
	done   chan struct{}

	// mu is held for reading while wakes are called, so that leave returns only once no
	// call to the leaving wake is under way: after its Listen returns, a wake is never
	// called again.
	mu        sync.RWMutex
	wakes     map[uint64]func(table, group string)
	nextID    uint64
	connected bool // it connected once: a wake that joins now is told to claim once
}

// joinListener adds wake to the listener for cfg's connection string, starting one when
// there is none.
func joinListener(cfg *pgx.ConnConfig, wake func(table, group string)) (*sharedListener, uint64) {
	key := cfg.ConnString()
	listeners.Lock()
	defer listeners.Unlock()
	l := listeners.m[key]
	if l == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l = &sharedListener{key: key, cancel: cancel, done: make(chan struct{}), wakes: map[uint64]func(string, string){}}
		if listeners.m == nil {
			listeners.m = map[string]*sharedListener{}
		}
		listeners.m[key] = l
		go func() {
			defer close(l.done)
			listenOn(ctx, cfg, l.fanOut)
		}()
	}
	l.mu.Lock()
	l.nextID++
	id := l.nextID
	l.wakes[id] = wake
	connected := l.connected
	l.mu.Unlock()
	if connected {
		// Rows published before this Listen began were announced to no one it serves.
		wake("", "")
	}
	return l, id
}

// fanOut passes one notification, or a reconnect's wake of everything, to every wake.
func (l *sharedListener) fanOut(table, group string) {
	if table == "" && group == "" {
		l.mu.Lock()
		l.connected = true
		l.mu.Unlock()
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, w := range l.wakes {
		w(table, group)
	}
}

// leave removes a wake; the last one out closes the session and waits for it to end.
// Removing the wake waits only for this listener's notification under way, not under
// the process-wide lock; whether it was the last one is decided under that lock, which
// every join holds.
func (l *sharedListener) leave(id uint64) {
	l.mu.Lock()
	delete(l.wakes, id)
	l.mu.Unlock()
	listeners.Lock()
	l.mu.RLock()
	last := len(l.wakes) == 0 && listeners.m[l.key] == l
	l.mu.RUnlock()
	if last {
		delete(listeners.m, l.key)
	}
	listeners.Unlock()
	if last {
		l.cancel()
		<-l.done
	}
}
