package snapfence

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Fence names the lease a write is fenced by: the token of the lease on Key. With contract
// v1.3 a lease on L fences L and every key under L/ (its namespace).
type Fence struct {
	Key   string
	Token uint64
}

// PutOptions are the optional parts of a PutSnapshot.
type PutOptions struct {
	// ContentType is stored with the body (application/octet-stream when "").
	ContentType string
	// FencingKey (contract v1.3) names the lease whose token fences the write, when it is not
	// the written key's own: a key whose namespace holds the written key (the key itself, or a
	// prefix of it ending before a "/"). Sent as the Fencing-Key header.
	FencingKey string
	// Metadata (contract v1.3) is marshalled to a JSON object (at most 4 KiB) stored with this
	// version (Snapshot-Metadata header); nil for none.
	Metadata any
	// IfMatch makes the write a compare-and-set on the current snapshot's ETag (as SnapshotMeta
	// or Snapshot shows it, quotes included): precondition_failed when it does not match, or when
	// the key has no current snapshot. Checked after the fencing rule.
	IfMatch string
}

// DeleteOptions are the optional parts of a DeleteSnapshot.
type DeleteOptions struct {
	// IfMatch makes the delete conditional on the current snapshot's ETag, as for PutOptions.
	IfMatch string
	// FencingKey (contract v1.3) names the fencing lease, as for PutOptions.
	FencingKey string
}

// fencingKeyHeader sets Fencing-Key, percent-encoded as a key is in a path.
func fencingKeyHeader(h http.Header, key string) {
	if key != "" {
		h.Set("Fencing-Key", url.PathEscape(key))
	}
}

// metadataHeader is a JSON object as the Snapshot-Metadata header carries it: ASCII only.
func metadataHeader(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", invalid("the snapshot metadata cannot be marshalled to JSON: %v", err)
	}
	if len(raw) == 0 || raw[0] != '{' {
		return "", invalid("the snapshot metadata must be a JSON object, not %s", truncate(string(raw), 40))
	}
	var b strings.Builder
	for _, r := range string(raw) {
		if r < 0x80 {
			b.WriteRune(r)
		} else if r <= 0xFFFF {
			fmt.Fprintf(&b, "\\u%04x", r)
		} else {
			r -= 0x10000
			fmt.Fprintf(&b, "\\u%04x\\u%04x", 0xD800+(r>>10), 0xDC00+(r&0x3FF))
		}
	}
	return b.String(), nil
}

// GetOptions are the optional parts of the snapshot reads.
type GetOptions struct {
	// IfNoneMatch answers Snapshot.NotModified (304, no body) when the snapshot's ETag matches
	// (weak comparison; "*" matches any).
	IfNoneMatch string
}

func replayed(a *answer) bool {
	return strings.EqualFold(strings.TrimSpace(a.header.Get("Idempotent-Replayed")), "true")
}

// PutSnapshot writes body as key's new current snapshot, fenced by token: accepted only when
// token is the key's newest token and that lease was not released or abandoned (a lease that
// merely expired, with no newer grant, may still write). Refusals are *Error values:
// stale_token (a superseded holder: stop writing), unknown_token (a token never issued for the
// key), both already in the audit log as AuditID; precondition_failed (IfMatch);
// payload_too_large; token_required.
func (c *Client) PutSnapshot(ctx context.Context, key string, token uint64, body []byte, opts PutOptions) (*Written, error) {
	path, err := keyPath("/v1/snapshots/", key, "")
	if err != nil {
		return nil, err
	}
	h, err := tokenHeader(token)
	if err != nil {
		return nil, err
	}
	h.Set("Accept", "application/json")
	contentType := opts.ContentType
	if contentType == "" {
		contentType = "application/octet-stream"
	}
	h.Set("Content-Type", contentType)
	if opts.IfMatch != "" {
		h.Set("If-Match", opts.IfMatch)
	}
	fencingKeyHeader(h, opts.FencingKey)
	if opts.Metadata != nil {
		m, err := metadataHeader(opts.Metadata)
		if err != nil {
			return nil, err
		}
		h.Set("Snapshot-Metadata", m)
	}
	if body == nil {
		body = []byte{}
	}
	a, err := c.send(ctx, request{method: http.MethodPut, path: path, header: h, body: body, changing: true}, http.StatusOK, http.StatusCreated)
	if err != nil {
		return nil, err
	}
	w := &Written{Created: a.status == http.StatusCreated, Replayed: replayed(a)}
	if err := decode(a, &w.SnapshotMeta); err != nil {
		return nil, err
	}
	return w, nil
}

// DeleteSnapshot removes key's current snapshot and its retained versions, fenced by token like
// PutSnapshot (same refusals, same audit). The version counter is kept. Deleting a key that has
// no current snapshot succeeds (unless IfMatch is set).
func (c *Client) DeleteSnapshot(ctx context.Context, key string, token uint64, opts DeleteOptions) error {
	path, err := keyPath("/v1/snapshots/", key, "")
	if err != nil {
		return err
	}
	h, err := tokenHeader(token)
	if err != nil {
		return err
	}
	if opts.IfMatch != "" {
		h.Set("If-Match", opts.IfMatch)
	}
	fencingKeyHeader(h, opts.FencingKey)
	_, err = c.send(ctx, request{method: http.MethodDelete, path: path, header: h, changing: true}, http.StatusNoContent)
	return err
}

// GetSnapshot reads key's current snapshot with its headers. not_found when it has none (never
// written, or deleted).
func (c *Client) GetSnapshot(ctx context.Context, key string, opts GetOptions) (*Snapshot, error) {
	return c.readSnapshot(ctx, http.MethodGet, key, 0, opts)
}

// HeadSnapshot is GetSnapshot without the body.
func (c *Client) HeadSnapshot(ctx context.Context, key string, opts GetOptions) (*Snapshot, error) {
	return c.readSnapshot(ctx, http.MethodHead, key, 0, opts)
}

// GetSnapshotVersion reads one retained version of key's snapshot. not_found once it was pruned
// (beyond the server's --keep-versions), deleted, or never written.
func (c *Client) GetSnapshotVersion(ctx context.Context, key string, version uint64, opts GetOptions) (*Snapshot, error) {
	if version == 0 {
		return nil, invalid("version 0 does not exist: versions count from 1")
	}
	return c.readSnapshot(ctx, http.MethodGet, key, version, opts)
}

// HeadSnapshotVersion is GetSnapshotVersion without the body.
func (c *Client) HeadSnapshotVersion(ctx context.Context, key string, version uint64, opts GetOptions) (*Snapshot, error) {
	if version == 0 {
		return nil, invalid("version 0 does not exist: versions count from 1")
	}
	return c.readSnapshot(ctx, http.MethodHead, key, version, opts)
}

func (c *Client) readSnapshot(ctx context.Context, method, key string, version uint64, opts GetOptions) (*Snapshot, error) {
	suffix := ""
	if version != 0 {
		suffix = "/versions/" + strconv.FormatUint(version, 10)
	}
	path, err := keyPath("/v1/snapshots/", key, suffix)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	if opts.IfNoneMatch != "" {
		h.Set("If-None-Match", opts.IfNoneMatch)
	}
	a, err := c.send(ctx, request{method: method, path: path, header: h}, http.StatusOK, http.StatusNotModified)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{
		Key:         key,
		ETag:        a.header.Get("ETag"),
		ContentType: a.header.Get("Content-Type"),
		Size:        -1,
		NotModified: a.status == http.StatusNotModified,
	}
	s.Version, _ = strconv.ParseUint(strings.TrimSpace(a.header.Get("Snapshot-Version")), 10, 64)
	s.Token, _ = strconv.ParseUint(strings.TrimSpace(a.header.Get("Fencing-Token")), 10, 64)
	if n, err := strconv.ParseInt(a.header.Get("Content-Length"), 10, 64); err == nil && !s.NotModified {
		s.Size = n
	}
	if t, err := http.ParseTime(a.header.Get("Last-Modified")); err == nil {
		s.LastModified = t.UTC()
	}
	if fk := a.header.Get("Fencing-Key"); fk != "" {
		if k, err := url.PathUnescape(fk); err == nil {
			s.FencingKey = k
		}
	}
	if m := a.header.Get("Snapshot-Metadata"); m != "" {
		s.Metadata = Metadata(m)
	}
	if method == http.MethodGet && !s.NotModified {
		s.Body = a.body
		if s.Size < 0 {
			s.Size = int64(len(a.body))
		}
	}
	return s, nil
}

// ListVersions lists the retained versions of key's snapshot, newest first, the current one
// included. not_found when the key has no current snapshot.
func (c *Client) ListVersions(ctx context.Context, key string, opts PageOptions) (*VersionPage, error) {
	path, err := keyPath("/v1/snapshots/", key, "/versions")
	if err != nil {
		return nil, err
	}
	return callJSON[VersionPage](ctx, c, request{method: http.MethodGet, path: path, query: opts.values(nil)})
}

// ListSnapshotsOptions selects the keys ListSnapshots returns.
type ListSnapshotsOptions struct {
	// Prefix selects keys that start with it ("" for all).
	Prefix string
	// StartAfter (contract v1.3) starts after this key, exclusive, in the order asked for
	// (with Descending, the keys before it).
	StartAfter string
	// Descending (contract v1.3) lists in reverse byte order.
	Descending bool
	// IncludeMetadata (contract v1.3) adds each current version's Metadata.
	IncludeMetadata bool
	// Limit is the page size, 1..=1000 (0: the server's default, 100).
	Limit int
	// Cursor is the NextCursor of the previous page ("" for the first).
	Cursor string
}

// ListSnapshots lists the keys that have a current snapshot (written and not deleted since), in
// byte order of their UTF-8 (reversed with Descending), one page at a time, each with its current
// version's head (Key set, no body): pass NextCursor back as Cursor until it is "". Each page is
// one committed state.
func (c *Client) ListSnapshots(ctx context.Context, opts ListSnapshotsOptions) (*SnapshotPage, error) {
	q := url.Values{}
	if opts.Prefix != "" {
		q.Set("prefix", opts.Prefix)
	}
	if opts.StartAfter != "" {
		q.Set("start_after", opts.StartAfter)
	}
	if opts.Descending {
		q.Set("order", "desc")
	}
	if opts.IncludeMetadata {
		q.Set("include", "metadata")
	}
	q = PageOptions{Limit: opts.Limit, Cursor: opts.Cursor}.values(q)
	return callJSON[SnapshotPage](ctx, c, request{method: http.MethodGet, path: "/v1/snapshots", query: q})
}

// PutJSON is PutSnapshot of v marshalled to JSON, as application/json.
func (c *Client) PutJSON(ctx context.Context, key string, token uint64, v any, opts PutOptions) (*Written, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, invalid("the snapshot cannot be marshalled to JSON: %v", err)
	}
	opts.ContentType = "application/json"
	return c.PutSnapshot(ctx, key, token, body, opts)
}

// GetJSON reads key's current snapshot and unmarshals its body into v; the snapshot's head is
// returned with it.
func (c *Client) GetJSON(ctx context.Context, key string, v any) (*Snapshot, error) {
	s, err := c.GetSnapshot(ctx, key, GetOptions{})
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(s.Body, v); err != nil {
		return s, fmt.Errorf("snapfence: the snapshot of %q (%s) is not the JSON asked for: %w", key, s.ContentType, err)
	}
	return s, nil
}

// AuditQuery selects audit rows.
type AuditQuery struct {
	// Key selects the rows of one key ("" for all).
	Key string
	// Reason selects by reason: CodeStaleToken or CodeUnknownToken for rejections,
	// ReasonAbandoned, ReasonExpired or ReasonRecoveryRequired for recoveries ("" for any).
	Reason string
	// Since selects rows at or after it (zero: no bound).
	Since time.Time
	// Until selects rows before it (zero: no bound).
	Until time.Time
	// Limit is the page size, 1..=1000 (0: the server's default, 100).
	Limit int
	// Cursor is the NextCursor of the previous page ("" for the first).
	Cursor string
}

func (q AuditQuery) path(base string) request {
	v := PageOptions{Limit: q.Limit, Cursor: q.Cursor}.values(nil)
	if q.Key != "" {
		v.Set("key", q.Key)
	}
	if q.Reason != "" {
		v.Set("reason", q.Reason)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	return request{method: http.MethodGet, path: base, query: v}
}

// ListRejections lists refused fenced writes and deletes, newest first, one page at a time.
// Needs an admin key when the server has API keys.
func (c *Client) ListRejections(ctx context.Context, q AuditQuery) (*RejectionPage, error) {
	return callJSON[RejectionPage](ctx, c, q.path("/v1/audit/rejections"))
}

// ListRecoveries lists the recovery records replaced by reconciling acquires, newest first, one
// page at a time. Needs an admin key when the server has API keys.
func (c *Client) ListRecoveries(ctx context.Context, q AuditQuery) (*RecoveryPage, error) {
	return callJSON[RecoveryPage](ctx, c, q.path("/v1/audit/recoveries"))
}
