package sqlite

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/rowactor/rowactor/dialects"
)

var (
	_ dialects.Elector  = (*Dialect)(nil)
	_ dialects.Retainer = (*Dialect)(nil)
)

// Lead takes the name's key in the file's registry of this process: brokers of one
// process on one file elect one leader; processes sharing the file each lead (SQLite has
// no session locks another process could see).
func (d *Dialect) Lead(ctx context.Context, name string) (dialects.Leadership, bool, error) {
	f, err := d.fileEntry(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("sqlite: lead %s: %w", name, err)
	}
	key := dialects.LeaderKey(name)
	if !f.tryKey(key) {
		return nil, false, nil
	}
	return &leadership{f: f, key: key}, true, nil
}

type leadership struct {
	f    *file
	key  string
	once sync.Once
}

func (l *leadership) Alive(context.Context) error { return nil }

func (l *leadership) Resign(context.Context) error {
	l.once.Do(func() { l.f.releaseKey(l.key) })
	return nil
}

// DeleteProcessed deletes the oldest finished rows in one statement in this process's
// writer turn.
func (d *Dialect) DeleteProcessed(ctx context.Context, t dialects.Table, before time.Time, limit int) (int64, error) {
	if err := d.checkTable(ctx, t); err != nil {
		return 0, err
	}
	if t.ProcessedAt == "" {
		return 0, fmt.Errorf("sqlite: retention on table %s: the description names no processed_at column", t.Name)
	}
	if limit <= 0 {
		return 0, nil
	}
	f, err := d.fileEntry(ctx)
	if err != nil {
		return 0, err
	}
	if err := f.lockWriter(ctx); err != nil {
		return 0, adminErr("retention", t.Name, err)
	}
	defer f.unlockWriter()
	tq, id := quote(t.Name), quote(t.ID)
	n, err := changed(d.db.ExecContext(ctx, "DELETE FROM "+tq+" WHERE "+id+" IN (SELECT "+id+" FROM "+tq+" WHERE "+
		quote(t.ProcessedAt)+" < ? ORDER BY "+id+" LIMIT "+strconv.Itoa(limit)+")", formatTime(before)))
	if err != nil {
		return 0, adminErr("retention", t.Name, err)
	}
	return n, nil
}
