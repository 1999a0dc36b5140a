package coordination

import (
	"context"
	"errors"
	"time"

	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// Snapshot is a key's saved state, as Save wrote it or Load read it.
type Snapshot struct {
	// Key is the key.
	Key string
	// Data is the saved bytes.
	Data []byte
	// Token is the fencing token that saved it.
	Token uint64
	// Version counts the accepted saves of the key, from 1.
	Version uint64
	// ETag is the service's strong entity tag of Data.
	ETag string
	// SavedAt is when it was saved (Save: the database clock, millisecond precision; Load: the
	// Last-Modified header, second precision).
	SavedAt time.Time
}

// Snapshots saves and loads a key's state, fenced by the service: a save is accepted only from
// the key's newest lease, so a holder that was superseded (it paused past its TTL and another
// took over) is refused however late it wakes up. Make one with NewSnapshots; it is safe for
// concurrent use.
type Snapshots struct {
	client      *snapfence.Client
	contentType string
}

// NewSnapshots returns the snapshot store of the service client talks to. contentType is stored
// with every save ("" for application/octet-stream).
func NewSnapshots(client *snapfence.Client, contentType string) *Snapshots {
	return &Snapshots{client: client, contentType: contentType}
}

// Save stores data as lease.Key's state, fenced by lease.Token. A holder that was superseded,
// or that released its lease, is refused with a *LostError (errors.Is(err, ErrRunLeaseLost))
// that unwraps to the service's *snapfence.Error (code stale_token, or unknown_token for a
// token the service never issued for the key); the refusal is in the service's audit log
// (AuditID). A lease that merely expired, with no newer grant, may still save.
func (s *Snapshots) Save(ctx context.Context, lease Lease, data []byte) (Snapshot, error) {
	if err := lease.Validate(); err != nil {
		return Snapshot{}, err
	}
	w, err := s.client.PutSnapshot(ctx, lease.Key, lease.Token, data, snapfence.PutOptions{ContentType: s.contentType})
	if err != nil {
		if errors.Is(err, snapfence.ErrStaleToken) || errors.Is(err, snapfence.ErrUnknownToken) {
			return Snapshot{}, &LostError{Key: lease.Key, Token: lease.Token, Reason: "the service refused the fenced save", Err: err}
		}
		return Snapshot{}, err
	}
	return Snapshot{
		Key:     lease.Key,
		Data:    data,
		Token:   w.Token,
		Version: w.Version,
		ETag:    w.ETag,
		SavedAt: w.UpdatedAt,
	}, nil
}

// Load reads key's state. It answers false, with no error, when the key has none (never saved,
// or deleted). Loading needs no lease.
func (s *Snapshots) Load(ctx context.Context, key string) (Snapshot, bool, error) {
	snap, err := s.client.GetSnapshot(ctx, key, snapfence.GetOptions{})
	if err != nil {
		if errors.Is(err, snapfence.ErrNotFound) {
			return Snapshot{}, false, nil
		}
		return Snapshot{}, false, err
	}
	return Snapshot{
		Key:     key,
		Data:    snap.Body,
		Token:   snap.Token,
		Version: snap.Version,
		ETag:    snap.ETag,
		SavedAt: snap.LastModified,
	}, true, nil
}
