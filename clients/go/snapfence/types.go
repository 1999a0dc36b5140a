package snapfence

import (
	"bytes"
	"encoding/json"
	"errors"
	"time"
)

// Metadata is a lease's metadata as the service stores it: a JSON object (at most 4 KiB
// serialized), or nil when the lease has none. Decode reads it into a Go value.
type Metadata []byte

// UnmarshalJSON keeps the JSON text as it is; JSON null leaves m nil.
func (m *Metadata) UnmarshalJSON(data []byte) error {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		*m = nil
		return nil
	}
	*m = append((*m)[:0], data...)
	return nil
}

// MarshalJSON writes the JSON text as it is, or null when m is empty.
func (m Metadata) MarshalJSON() ([]byte, error) {
	if len(m) == 0 {
		return []byte("null"), nil
	}
	if !json.Valid(m) {
		return nil, errors.New("snapfence: metadata is not valid JSON")
	}
	return m, nil
}

// Decode unmarshals the metadata into v. It reports ErrNoMetadata when there is none.
func (m Metadata) Decode(v any) error {
	if len(m) == 0 {
		return ErrNoMetadata
	}
	return json.Unmarshal(m, v)
}

// ErrNoMetadata is returned by Metadata.Decode for a lease (or record) that has no metadata.
var ErrNoMetadata = errors.New("snapfence: no metadata")

// Lease is a lease as the service grants, renews or stores it: the newest lease of its key.
type Lease struct {
	// Key is the leased key, as stored (decoded).
	Key string `json:"key"`
	// Owner is who holds the lease.
	Owner string `json:"owner"`
	// Token is the lease's fencing token: a new one at every grant, kept by renewals.
	Token uint64 `json:"token"`
	// AcquiredAt is when the lease was granted (database clock).
	AcquiredAt time.Time `json:"acquired_at"`
	// ExpiresAt is when it expires unless renewed (database clock); in the past once expired.
	ExpiresAt time.Time `json:"expires_at"`
	// TTLMillis is the TTL of the grant, or of the last renewal that set one, in milliseconds.
	TTLMillis int64 `json:"ttl_ms"`
	// Metadata is what the holder attached at acquire, or nil.
	Metadata Metadata `json:"metadata"`
	// CrashRecovery says whether an expiry (rather than a release) leaves a recovery record.
	CrashRecovery bool `json:"crash_recovery"`
	// RecoveryRequired says whether require-recovery marked the lease, so that its release or
	// expiry leaves a recovery record.
	RecoveryRequired bool `json:"recovery_required"`
}

// TTL is TTLMillis as a duration.
func (l Lease) TTL() time.Duration { return time.Duration(l.TTLMillis) * time.Millisecond }

// Grant is the answer of a successful acquire: the new lease and, when the acquire replaced a
// retained recovery record (reconciled), that record.
type Grant struct {
	Lease
	// Recovered is the recovery record this grant replaced, or nil.
	Recovered *RecoveryRecord `json:"recovered,omitempty"`
	// Recovery (contract v1.2) is the recovery record a Reconciling grant holds the key with:
	// retained until Reconciled confirms it; nil when the key had none.
	Recovery *RecoveryRecord `json:"recovery,omitempty"`
	// Replayed is true when the service answered with the stored answer of an earlier attempt
	// with the same Idempotency-Key (Idempotent-Replayed: true) rather than granting again.
	Replayed bool `json:"-"`
}

// Recovery reasons: why a recovery record exists.
const (
	// ReasonAbandoned: the holder abandoned the lease.
	ReasonAbandoned = "abandoned"
	// ReasonExpired: a crash_recovery lease expired instead of being released.
	ReasonExpired = "expired"
	// ReasonRecoveryRequired: the holder called require-recovery, then released or let it expire.
	ReasonRecoveryRequired = "recovery_required"
)

// RecoveryRecord is what a crashed, abandoning or marked holder left behind. While retained it
// blocks every grant of its key until an acquire with Reconciled replaces it.
type RecoveryRecord struct {
	// Owner is the holder that left it.
	Owner string `json:"owner"`
	// Token is that holder's fencing token.
	Token uint64 `json:"token"`
	// AcquiredAt is when that lease was granted.
	AcquiredAt time.Time `json:"acquired_at"`
	// EndedAt is when that lease ended: its release, abandon or expiry.
	EndedAt time.Time `json:"ended_at"`
	// Reason is ReasonAbandoned, ReasonExpired or ReasonRecoveryRequired.
	Reason string `json:"reason"`
	// Metadata is that lease's metadata, or nil.
	Metadata Metadata `json:"metadata"`
}

// Lease states, as GetLease and ListLeases report them.
const (
	// StateHeld: a live lease.
	StateHeld = "held"
	// StateExpired: the newest lease expired and left no recovery record; the key is free.
	StateExpired = "expired"
	// StateReleased: released, no recovery record; the key is free.
	StateReleased = "released"
	// StateRecoveryPending: a recovery record blocks the next grant until a reconciled acquire.
	StateRecoveryPending = "recovery_pending"
)

// KeyStatus is everything the service tells about a key that has been leased at least once.
type KeyStatus struct {
	// Key is the key.
	Key string `json:"key"`
	// State is StateHeld, StateExpired, StateReleased or StateRecoveryPending, derived from the
	// database clock at the time of the read.
	State string `json:"state"`
	// Lease is the newest lease, also when it expired or was released.
	Lease Lease `json:"lease"`
	// Recovery is the retained recovery record, or nil.
	Recovery *RecoveryRecord `json:"recovery"`
	// NewestToken is the token a fenced write must present.
	NewestToken uint64 `json:"newest_token"`
}

// LeasePage is one page of ListLeases, in byte order of the key.
type LeasePage struct {
	// Items are the keys of this page.
	Items []KeyStatus `json:"items"`
	// NextCursor is the cursor of the next page, or "" on the last page.
	NextCursor string `json:"next_cursor"`
}

// Waiter is one waiting acquire (AcquireRequest.Wait) in a key's queue, as ListLeaseWaiters
// shows it.
type Waiter struct {
	// Position is its place in the queue, from 1 (the next to be granted the key), counted over
	// the whole queue rather than the page.
	Position int64 `json:"position"`
	// Owner is the owner its acquire asked for; "" for a waiter queued by a server too old to
	// keep it.
	Owner string `json:"owner"`
	// Since is when it took its place (database clock).
	Since time.Time `json:"since"`
}

// WaiterPage is one page of ListLeaseWaiters, first to be granted first.
type WaiterPage struct {
	// Items are the waiters of this page.
	Items []Waiter `json:"items"`
	// NextCursor is the cursor of the next page, or "" on the last page.
	NextCursor string `json:"next_cursor"`
}

// Holder is who holds a key, as a lease_held refusal shows it (without the holder's token).
type Holder struct {
	// Owner is the holder's owner name.
	Owner string `json:"owner"`
	// AcquiredAt is when the live lease was granted.
	AcquiredAt time.Time `json:"acquired_at"`
	// ExpiresAt is when it expires unless renewed.
	ExpiresAt time.Time `json:"expires_at"`
	// Metadata is the live lease's metadata, or nil.
	Metadata Metadata `json:"metadata"`
}

// SnapshotMeta describes one stored version of a snapshot, without its body.
type SnapshotMeta struct {
	// Key is the key; set in the answer of a write and in ListSnapshots, empty in a versions
	// list.
	Key string `json:"key,omitempty"`
	// Version counts the accepted writes of the key, from 1; never reset, not even by a delete.
	Version uint64 `json:"version"`
	// Token is the fencing token that wrote it.
	Token uint64 `json:"token"`
	// ETag is the strong entity tag, quotes included, as the ETag header shows it.
	ETag string `json:"etag"`
	// Size is the body's size in bytes.
	Size int64 `json:"size"`
	// ContentType is the Content-Type it was written with.
	ContentType string `json:"content_type"`
	// UpdatedAt is when it was written (database clock).
	UpdatedAt time.Time `json:"updated_at"`
	// FencingKey is the fence the write named (contract v1.3; its own key when it named none).
	FencingKey string `json:"fencing_key,omitempty"`
	// Metadata is the version's Snapshot-Metadata (contract v1.3), or nil.
	Metadata Metadata `json:"metadata,omitempty"`
}

// Written is the answer of an accepted snapshot write.
type Written struct {
	SnapshotMeta
	// Created is true when the key had no current snapshot before this write (201), false when
	// the write replaced one (200).
	Created bool `json:"-"`
	// Replayed is true when the service answered with the stored answer of an earlier attempt
	// with the same Idempotency-Key (Idempotent-Replayed: true) rather than writing again.
	Replayed bool `json:"-"`
}

// VersionPage is one page of ListVersions, newest first.
type VersionPage struct {
	// Items are the versions of this page (without Key).
	Items []SnapshotMeta `json:"items"`
	// NextCursor is the cursor of the next page, or "" on the last page.
	NextCursor string `json:"next_cursor"`
}

// SnapshotPage is one page of ListSnapshots, in byte order of the key.
type SnapshotPage struct {
	// Items are the current snapshots of this page's keys, without their bodies (Key set).
	Items []SnapshotMeta `json:"items"`
	// NextCursor is the cursor of the next page, or "" on the last page.
	NextCursor string `json:"next_cursor"`
}

// Snapshot is a snapshot as read by GetSnapshot, GetSnapshotVersion or their Head variants.
type Snapshot struct {
	// Key is the key that was read.
	Key string
	// Version is the Snapshot-Version header.
	Version uint64
	// Token is the Fencing-Token header: the token that wrote this version.
	Token uint64
	// ETag is the strong entity tag, quotes included.
	ETag string
	// ContentType is the Content-Type it was written with (empty on a 304).
	ContentType string
	// Size is the body's size (Content-Length); -1 when the server did not say (a 304).
	Size int64
	// LastModified is when it was written, with second precision.
	LastModified time.Time
	// Body is the stored bytes; nil for a Head call and when NotModified.
	Body []byte
	// NotModified is true when If-None-Match matched: the server answered 304 without a body.
	NotModified bool
	// FencingKey is the Fencing-Key header: the fence of the write (contract v1.3).
	FencingKey string
	// Metadata is the Snapshot-Metadata header (contract v1.3), or nil.
	Metadata Metadata
}

// Rejection is one refused fenced write or delete, as the audit log shows it.
type Rejection struct {
	// ID is the audit row's id; pages are ordered by it, newest first.
	ID int64 `json:"id"`
	// At is when the write was refused (database clock).
	At time.Time `json:"at"`
	// Key is the key written to.
	Key string `json:"key"`
	// Reason is CodeStaleToken or CodeUnknownToken.
	Reason string `json:"reason"`
	// PresentedToken is the token the writer presented.
	PresentedToken uint64 `json:"presented_token"`
	// HighestToken is the key's newest token at the time, or 0 for a key never leased.
	HighestToken uint64 `json:"highest_token"`
	// Holder is the owner of the key's newest lease at the time, or "".
	Holder string `json:"holder"`
	// Operation is "put" or "delete".
	Operation string `json:"operation"`
	// RequestID is the refused request's x-request-id, or "".
	RequestID string `json:"request_id"`
	// RemoteAddr is the refused request's peer address, or "".
	RemoteAddr string `json:"remote_addr"`
	// Principal is the API key's name that made the request, or "" without authentication.
	Principal string `json:"principal"`
}

// RejectionPage is one page of ListRejections, newest first.
type RejectionPage struct {
	// Items are the rejections of this page.
	Items []Rejection `json:"items"`
	// NextCursor is the cursor of the next page, or "" on the last page.
	NextCursor string `json:"next_cursor"`
}

// RecoveryEntry is one recovery record replaced by a reconciled acquire (operation
// "reconcile"), or, with contract v1.2, kept by a reconciling grant ("reconciling") or moved to
// the log by that holder's confirmation ("reconciled"), as the audit log shows it.
type RecoveryEntry struct {
	// ID is the audit row's id; pages are ordered by it, newest first.
	ID int64 `json:"id"`
	// At is when the record was replaced (database clock).
	At time.Time `json:"at"`
	// Key is the key.
	Key string `json:"key"`
	// Reason is the replaced record's reason.
	Reason string `json:"reason"`
	// PresentedToken is the confirming holder's token for "reconciled" (v1.2); 0 for the
	// grants, which present none.
	PresentedToken uint64 `json:"presented_token"`
	// HighestToken is the reconciling grant's token.
	HighestToken uint64 `json:"highest_token"`
	// Holder is the reconciling grant's owner.
	Holder string `json:"holder"`
	// Operation is "reconcile", or (v1.2) "reconciling" or "reconciled".
	Operation string `json:"operation"`
	// RequestID is the reconciling request's x-request-id, or "".
	RequestID string `json:"request_id"`
	// RemoteAddr is the reconciling request's peer address, or "".
	RemoteAddr string `json:"remote_addr"`
	// Principal is the API key's name that made the request, or "".
	Principal string `json:"principal"`
	// Recovery is the record that was replaced.
	Recovery RecoveryRecord `json:"recovery"`
	// ReconciledBy is who stated that the leftovers were reconciled.
	ReconciledBy string `json:"reconciled_by"`
}

// RecoveryPage is one page of ListRecoveries, newest first.
type RecoveryPage struct {
	// Items are the replaced records of this page.
	Items []RecoveryEntry `json:"items"`
	// NextCursor is the cursor of the next page, or "" on the last page.
	NextCursor string `json:"next_cursor"`
}
