package geoip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync/atomic"
	"time"
)

// ErrUnchanged is what Source.Reload returns when the file did not change.
var ErrUnchanged = errors.New("geoip: file unchanged")

// Source is the database at a path, reloaded when the file changes. Its
// Country is safe for concurrent use, during a reload too.
type Source struct {
	path string
	db   atomic.Pointer[DB]
	// seen is the file Reload last opened or failed to open: it opens a
	// file again only when the file changed since.
	seen os.FileInfo
}

// OpenSource opens the database at path (see Open).
func OpenSource(path string) (*Source, error) {
	s := &Source{path: path}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("geoip: %w", err)
	}
	db, err := Open(path)
	if err != nil {
		return nil, err
	}
	s.seen = fi
	s.db.Store(db)
	return s, nil
}

// Country returns the country of a in the database loaded now (see
// DB.Country).
func (s *Source) Country(a netip.Addr) string { return s.db.Load().Country(a) }

// DB returns the database loaded now.
func (s *Source) DB() *DB { return s.db.Load() }

// Reload opens the file again if it changed since the last Reload (or
// OpenSource): another file at the path (a rename over it), another size
// or modification time. It returns ErrUnchanged when it did not, and the
// error of a changed file that does not open, which leaves the loaded
// database in service and is not retried until the file changes again.
// Reload is not safe for concurrent use with itself.
func (s *Source) Reload() error {
	fi, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("geoip: %w", err)
	}
	if s.seen != nil && os.SameFile(s.seen, fi) && fi.Size() == s.seen.Size() && fi.ModTime().Equal(s.seen.ModTime()) {
		return ErrUnchanged
	}
	s.seen = fi
	db, err := Open(s.path)
	if err != nil {
		return err
	}
	s.db.Store(db)
	return nil
}

// Watch calls Reload every interval until ctx ends, logging each new
// database and each changed file that failed to open.
func (s *Source) Watch(ctx context.Context, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		switch err := s.Reload(); {
		case errors.Is(err, ErrUnchanged):
		case err != nil:
			log.ErrorContext(ctx, "geoip database changed but does not open: keeping the loaded one",
				"path", s.path, "loaded_build", s.DB().Built, "err", err)
		default:
			db := s.DB()
			log.InfoContext(ctx, "geoip database reloaded", "path", s.path, "type", db.Type, "build", db.Built)
		}
	}
}
