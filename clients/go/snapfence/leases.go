package snapfence

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// AcquireRequest is what Acquire asks for.
type AcquireRequest struct {
	// Owner names the holder: 1..=256 bytes of UTF-8, no control characters. Required.
	Owner string
	// TTL is the lease's time to live, in whole milliseconds, within the server's bounds
	// (default 100 ms..=24 h). Required.
	TTL time.Duration
	// Metadata is marshalled to a JSON object (at most 4 KiB) stored and shown with the lease;
	// nil for none.
	Metadata any
	// CrashRecovery makes the key keep a recovery record if this lease ends by expiry instead
	// of release.
	CrashRecovery bool
	// Reconciled states that whatever a previous holder left behind no longer conflicts: only
	// then is a retained recovery record replaced (Grant.Recovered) instead of refused with
	// recovery_required. Set it only after checking.
	Reconciled bool
	// Reconciling (contract v1.2; exclusive with Reconciled) asks for the key while a recovery
	// record is retained, to examine the leftovers while holding it: the grant keeps the record
	// (Grant.Recovery) and everyone else is refused lease_held until the holder calls Reconciled
	// (the record goes to the audit log) or its lease ends (the record stays as it was). On a key
	// with no record it is a plain grant. A server before v1.2 refuses it with invalid_request.
	Reconciling bool
	// Wait (contract v1.1) asks the server to wait up to this long for a held key instead of
	// answering lease_held at once. Sent only when positive: a server without waiting
	// acquires refuses it with invalid_request. Each attempt of the call may take the client's
	// timeout (WithTimeout) plus Wait.
	Wait time.Duration
}

type acquireBody struct {
	Owner         string          `json:"owner"`
	TTLMillis     int64           `json:"ttl_ms"`
	Metadata      json.RawMessage `json:"metadata,omitempty"`
	CrashRecovery bool            `json:"crash_recovery,omitempty"`
	Reconciled    bool            `json:"reconciled,omitempty"`
	Reconciling   bool            `json:"reconciling,omitempty"`
	WaitMillis    int64           `json:"wait_ms,omitempty"`
}

func millis(d time.Duration) int64 { return int64(d / time.Millisecond) }

// Acquire asks for a lease on key. It never waits (unless Wait is set) and never changes
// another holder's lease. Refusals are *Error values: lease_held (Holder says who, until when),
// recovery_required (Recovery is the retained record: reconcile, then acquire with Reconciled),
// invalid_request.
func (c *Client) Acquire(ctx context.Context, key string, req AcquireRequest) (*Grant, error) {
	path, err := keyPath("/v1/leases/", key, "")
	if err != nil {
		return nil, err
	}
	if req.Owner == "" {
		return nil, invalid("the owner is empty (an owner is 1..=256 bytes of UTF-8)")
	}
	if millis(req.TTL) <= 0 {
		return nil, invalid("the TTL %v is not a positive number of milliseconds", req.TTL)
	}
	if req.Reconciled && req.Reconciling {
		return nil, invalid("reconciled and reconciling exclude each other")
	}
	body := acquireBody{
		Owner:         req.Owner,
		TTLMillis:     millis(req.TTL),
		CrashRecovery: req.CrashRecovery,
		Reconciled:    req.Reconciled,
		Reconciling:   req.Reconciling,
		WaitMillis:    millis(req.Wait),
	}
	if req.Metadata != nil {
		raw, err := json.Marshal(req.Metadata)
		if err != nil {
			return nil, invalid("the metadata cannot be marshalled to JSON: %v", err)
		}
		if string(raw) != "null" {
			body.Metadata = raw
		}
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, invalid("the acquire cannot be marshalled to JSON: %v", err)
	}
	a, err := c.send(ctx, request{method: http.MethodPost, path: path, header: jsonHeader(), body: data, changing: true, wait: req.Wait}, http.StatusCreated)
	if err != nil {
		return nil, err
	}
	var g Grant
	if err := decode(a, &g); err != nil {
		return nil, err
	}
	g.Replayed = replayed(a)
	return &g, nil
}

type renewBody struct {
	Token     uint64 `json:"token"`
	TTLMillis int64  `json:"ttl_ms,omitempty"`
}

// Renew extends the live lease of token on key to ttl from the server's now (ttl 0 keeps the
// lease's TTL); the token is kept. A token that is not the key's live lease (expired, released,
// abandoned, superseded) is refused with lease_lost: the holder must stop working.
func (c *Client) Renew(ctx context.Context, key string, token uint64, ttl time.Duration) (*Lease, error) {
	path, err := keyPath("/v1/leases/", key, "/renew")
	if err != nil {
		return nil, err
	}
	if _, err := tokenHeader(token); err != nil {
		return nil, err
	}
	if ttl < 0 || (ttl > 0 && millis(ttl) == 0) {
		return nil, invalid("the TTL %v is not a positive number of milliseconds", ttl)
	}
	data, _ := json.Marshal(renewBody{Token: token, TTLMillis: millis(ttl)})
	return callJSON[Lease](ctx, c, request{method: http.MethodPost, path: path, header: jsonHeader(), body: data, changing: true})
}

// fenced sends a bodiless fenced lease call that answers 204.
func (c *Client) fenced(ctx context.Context, method, key, suffix string, token uint64) error {
	path, err := keyPath("/v1/leases/", key, suffix)
	if err != nil {
		return err
	}
	h, err := tokenHeader(token)
	if err != nil {
		return err
	}
	_, err = c.send(ctx, request{method: method, path: path, header: h, changing: true}, http.StatusNoContent)
	return err
}

// Release ends the live lease of token on key: the key is free at once, unless require-recovery
// marked the lease, in which case its recovery record stays. After it the token can no longer
// write. A token that is not the live lease is refused with lease_lost, and a newer holder is
// untouched.
func (c *Client) Release(ctx context.Context, key string, token uint64) error {
	return c.fenced(ctx, http.MethodDelete, key, "", token)
}

// Abandon unlocks key but keeps a recovery record (reason abandoned): the next acquire must
// reconcile. Refused with lease_lost like Release.
func (c *Client) Abandon(ctx context.Context, key string, token uint64) error {
	return c.fenced(ctx, http.MethodPost, key, "/abandon", token)
}

// RequireRecovery marks the live lease's cleanup incomplete while still holding it: the lease
// stays live, and its later release or expiry leaves a recovery record (reason
// recovery_required). Refused with lease_lost like Release.
func (c *Client) RequireRecovery(ctx context.Context, key string, token uint64) error {
	return c.fenced(ctx, http.MethodPost, key, "/require-recovery", token)
}

// Reconciled (contract v1.2) confirms, as the live lease of token on key granted with
// Reconciling, that what the recovery record's holder left no longer conflicts: the record moves
// to the audit log (ListRecoveries, operation "reconciled") and the lease goes on (200 with it).
// A token that is not the key's live lease is refused with lease_lost, and the record stays. A
// server before v1.2 answers 404.
func (c *Client) Reconciled(ctx context.Context, key string, token uint64) (*Lease, error) {
	path, err := keyPath("/v1/leases/", key, "/reconciled")
	if err != nil {
		return nil, err
	}
	h, err := tokenHeader(token)
	if err != nil {
		return nil, err
	}
	return callJSON[Lease](ctx, c, request{method: http.MethodPost, path: path, header: h, changing: true})
}

// GetLease returns key's state, newest lease, retained recovery record and newest token. A key
// that was never leased is not_found.
func (c *Client) GetLease(ctx context.Context, key string) (*KeyStatus, error) {
	path, err := keyPath("/v1/leases/", key, "")
	if err != nil {
		return nil, err
	}
	return callJSON[KeyStatus](ctx, c, request{method: http.MethodGet, path: path})
}

// ListLeasesOptions selects the keys ListLeases returns.
type ListLeasesOptions struct {
	// Prefix selects keys that start with it ("" for all).
	Prefix string
	// State selects keys in this state (StateHeld, ...; "" for any).
	State string
	// Limit is the page size, 1..=1000 (0: the server's default, 100).
	Limit int
	// Cursor is the NextCursor of the previous page ("" for the first).
	Cursor string
}

func (o PageOptions) values(q url.Values) url.Values {
	if q == nil {
		q = url.Values{}
	}
	if o.Limit != 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	return q
}

// PageOptions pages through a list.
type PageOptions struct {
	// Limit is the page size, 1..=1000 (0: the server's default, 100).
	Limit int
	// Cursor is the NextCursor of the previous page ("" for the first).
	Cursor string
}

// ListLeases lists the keys that were ever leased, in byte order, one page at a time: pass
// NextCursor back as Cursor until it is "".
func (c *Client) ListLeases(ctx context.Context, opts ListLeasesOptions) (*LeasePage, error) {
	q := url.Values{}
	if opts.Prefix != "" {
		q.Set("prefix", opts.Prefix)
	}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	q = PageOptions{Limit: opts.Limit, Cursor: opts.Cursor}.values(q)
	return callJSON[LeasePage](ctx, c, request{method: http.MethodGet, path: "/v1/leases", query: q})
}

// ListLeaseWaiters lists key's queue of waiting acquires (AcquireRequest.Wait), one page at a
// time, first to be granted first: pass NextCursor back as Cursor until it is "". Each Waiter
// has its Position in the whole queue (from 1), the Owner it asked for and Since when it waits.
// A key no one waits for, leased or not, has an empty page (not not_found). Beyond the contract
// (GET /v1/leases/{key}/waiters): a waiter of a server instance that died is listed until a
// sweep removes it (within a second), though acquires pass it over.
func (c *Client) ListLeaseWaiters(ctx context.Context, key string, opts PageOptions) (*WaiterPage, error) {
	path, err := keyPath("/v1/leases/", key, "/waiters")
	if err != nil {
		return nil, err
	}
	return callJSON[WaiterPage](ctx, c, request{method: http.MethodGet, path: path, query: opts.values(nil)})
}

// Health checks GET /healthz: the process is up.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.send(ctx, request{method: http.MethodGet, path: "/healthz"}, http.StatusOK)
	return err
}

// Ready checks GET /readyz: the database is reachable and migrated (else 503 unavailable,
// retried by the RetryPolicy).
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.send(ctx, request{method: http.MethodGet, path: "/readyz"}, http.StatusOK)
	return err
}

// Metrics reads GET /metrics: the service's Prometheus text exposition.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	a, err := c.send(ctx, request{method: http.MethodGet, path: "/metrics"}, http.StatusOK)
	if err != nil {
		return "", err
	}
	return string(a.body), nil
}
