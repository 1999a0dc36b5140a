package snapfence

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The kinds of change a watch delivers (ChangeEvent.Kind).
const (
	EventLeaseGranted          = "lease.granted"
	EventLeaseReleased         = "lease.released"
	EventLeaseAbandoned        = "lease.abandoned"
	EventLeaseExpired          = "lease.expired"
	EventLeaseRecoveryRequired = "lease.recovery_required"
	EventLeaseReconciled       = "lease.reconciled"
	EventSnapshotWritten       = "snapshot.written"
	EventSnapshotDeleted       = "snapshot.deleted"
	EventWriteRefused          = "write.refused"
)

var changeKinds = map[string]bool{
	EventLeaseGranted: true, EventLeaseReleased: true, EventLeaseAbandoned: true, EventLeaseExpired: true,
	EventLeaseRecoveryRequired: true, EventLeaseReconciled: true, EventSnapshotWritten: true,
	EventSnapshotDeleted: true, EventWriteRefused: true,
}

// ChangeEvent is one change from a watch. The members a kind does not have are zero.
type ChangeEvent struct {
	// ID is the change id: strictly increasing over the whole service.
	ID uint64 `json:"-"`
	// Kind is one of the Event* constants.
	Kind string `json:"-"`
	// Key is the key that changed.
	Key string `json:"key"`
	// Token is the lease's token (lease.*), the writer's (snapshot.*) or the refused one
	// (write.refused).
	Token uint64 `json:"token"`
	// At is when it happened (database clock).
	At time.Time `json:"at"`
	// Owner is the lease's owner, for lease events.
	Owner string `json:"owner"`
	// ExpiresAt is the lease's expiry, for lease.granted.
	ExpiresAt *time.Time `json:"expires_at"`
	// Version and ETag are the snapshot's, for snapshot.*.
	Version uint64 `json:"version"`
	ETag    string `json:"etag"`
	// Reason and AuditID are the refusal's, for write.refused.
	Reason  string `json:"reason"`
	AuditID int64  `json:"audit_id"`
	// FencingKey is the fence of a write (contract v1.3).
	FencingKey string `json:"fencing_key"`
	// Txn is the id of the first change of the transaction this change is part of, and TxnSize
	// how many changes it made (contract v1.3); 0 outside a transaction.
	Txn     uint64 `json:"txn"`
	TxnSize int    `json:"txn_size"`
	// Data is the event's JSON as sent.
	Data json.RawMessage `json:"-"`
}

// WatchOptions select what a Watch delivers.
type WatchOptions struct {
	// Prefix selects the keys that start with it ("" for all).
	Prefix string
	// Since resumes after this change id (0: from the moment the watch connects).
	Since uint64
	// IdleTimeout is how long a stream may stay silent, heartbeats included, before the watch
	// resumes on a new connection (0: 45 s; the service sends a heartbeat every 15 s).
	IdleTimeout time.Duration
}

// Watch is the service's feed of changes (GET /v1/watch): every change after the point it
// started from, in id order, each once. When a stream ends, breaks or goes silent it
// reconnects by itself with Last-Event-ID. Next returns an error that ends the watch when
// resuming is impossible (compacted), when the service refuses it (unauthorized, forbidden,
// invalid_request), or after the client's RetryPolicy.MaxAttempts failed connections in a row.
// Close ends it. Use it from one goroutine at a time.
type Watch struct {
	c     *Client
	opts  WatchOptions
	trace http.Header // the trace context of Watch's ctx, sent on every connection

	ctx    context.Context
	cancel context.CancelFunc

	last     uint64
	hasLast  bool
	failures int
	ended    error
	pending  chan connectResult // a connection whose head Next stopped waiting for

	mu    sync.Mutex
	lines chan watchLine
	body  io.Closer
	gone  chan struct{} // closed when the connection is dropped: its reader stops
}

type connectResult struct {
	resp *http.Response
	err  error
}

type watchLine struct {
	text string
	err  error
}

// Watch opens a watch and connects at once, so that every change from now on is delivered
// (what a reader that reads the current state next needs). Every connection of the watch, the
// resumed ones included, carries the trace context of ctx (ContextWithTraceparent,
// WithTraceContext).
func (c *Client) Watch(ctx context.Context, opts WatchOptions) (*Watch, error) {
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 45 * time.Second
	}
	wctx, cancel := context.WithCancel(context.Background())
	w := &Watch{c: c, opts: opts, trace: c.traceHeader(ctx), ctx: wctx, cancel: cancel}
	if opts.Since != 0 {
		w.last, w.hasLast = opts.Since, true
	}
	for w.lines == nil {
		if err := w.connect(ctx); err != nil {
			w.Close()
			return nil, err
		}
	}
	return w, nil
}

// LastID is the id of the last change received (or where the stream started): pass it as
// Since to a later watch to go on from there.
func (w *Watch) LastID() uint64 { return w.last }

// Close ends the watch and its connection.
func (w *Watch) Close() {
	w.cancel()
	w.drop()
	if p := w.pending; p != nil {
		w.pending = nil
		go func() {
			if r := <-p; r.resp != nil {
				r.resp.Body.Close()
			}
		}()
	}
}

func (w *Watch) drop() {
	w.mu.Lock()
	body, gone := w.body, w.gone
	w.body, w.lines, w.gone = nil, nil, nil
	w.mu.Unlock()
	if gone != nil {
		close(gone)
	}
	if body != nil {
		_ = body.Close()
	}
}

// connect makes one attempt; a nil error with no connection means "try again".
func (w *Watch) connect(ctx context.Context) error {
	q := url.Values{}
	if w.opts.Prefix != "" {
		q.Set("prefix", w.opts.Prefix)
	}
	target := w.c.base + "/v1/watch"
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(w.ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	for name, values := range w.trace {
		req.Header[name] = values
	}
	req.Header.Set("Accept", "text/event-stream")
	if w.hasLast {
		req.Header.Set("Last-Event-ID", strconv.FormatUint(w.last, 10))
	}
	if w.c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+w.c.apiKey)
	}
	if w.c.userAgent != "" {
		req.Header.Set("User-Agent", w.c.userAgent)
	}
	// The connection is the watch's (Close ends it); ctx only bounds the wait for its head, and
	// a head that comes after ctx ended is taken by the next attempt.
	done := w.pending
	w.pending = nil
	if done == nil {
		done = make(chan connectResult, 1)
		go func() {
			resp, err := w.c.http.Do(req)
			done <- connectResult{resp, err}
		}()
	}
	var r connectResult
	select {
	case r = <-done:
	case <-ctx.Done():
		w.pending = done
		return ctx.Err()
	}
	if r.err != nil {
		return w.failed(ctx, &TransportError{Method: http.MethodGet, URL: target, Sent: mayHaveBeenSent(r.err), Err: r.err})
	}
	if r.resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(r.resp.Body, 1<<16))
		r.resp.Body.Close()
		return w.failed(ctx, newAPIError(http.MethodGet, target, r.resp.StatusCode, r.resp.Header, body))
	}
	if ct := r.resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		r.resp.Body.Close()
		return fmt.Errorf("snapfence: the answer to GET /v1/watch is %q, not text/event-stream: is %s a snapfence service?", ct, w.c.base)
	}
	if after, err := strconv.ParseUint(strings.TrimSpace(r.resp.Header.Get("Watch-After")), 10, 64); err == nil && !w.hasLast {
		w.last, w.hasLast = after, true
	}
	w.failures = 0
	lines := make(chan watchLine, 64)
	gone := make(chan struct{})
	go func(body io.Reader) {
		defer close(lines)
		rd := bufio.NewReaderSize(body, 64<<10)
		for {
			text, err := rd.ReadString('\n')
			l := watchLine{text: strings.TrimRight(text, "\r\n"), err: err}
			select {
			case lines <- l:
			case <-gone:
				return
			}
			if err != nil {
				return
			}
		}
	}(r.resp.Body)
	w.mu.Lock()
	w.body, w.lines, w.gone = r.resp.Body, lines, gone
	w.mu.Unlock()
	return nil
}

// failed counts a failed connection: the error when it ends the watch, else nil after the
// pause before the next attempt.
func (w *Watch) failed(ctx context.Context, err error) error {
	w.failures++
	retry := false
	var apiErr *Error
	var tErr *TransportError
	switch {
	case errors.As(err, &apiErr):
		retry = apiErr.Retryable() || apiErr.Status >= 500
	case errors.As(err, &tErr):
		retry = retryableTransport(tErr)
	}
	if !retry || w.failures >= w.c.retry.MaxAttempts {
		return err
	}
	if !sleep(ctx, w.c.retry.backoff(w.failures)) {
		return ctx.Err()
	}
	return nil
}

// Next is the next change, waiting for it until ctx is done (the watch goes on: call Next
// again). An error other than ctx's ends the watch.
func (w *Watch) Next(ctx context.Context) (*ChangeEvent, error) {
	if w.ended != nil {
		return nil, w.ended
	}
	var id, event string
	var data []string
	var any bool
	for {
		if w.ctx.Err() != nil {
			return nil, errors.New("snapfence: the watch is closed")
		}
		w.mu.Lock()
		lines := w.lines
		w.mu.Unlock()
		if lines == nil {
			if err := w.connect(ctx); err != nil {
				if ctx.Err() == nil {
					w.ended = err
				}
				return nil, err
			}
			id, event, data, any = "", "", nil, false
			continue
		}
		idle := time.NewTimer(w.opts.IdleTimeout)
		var l watchLine
		var ok bool
		select {
		case l, ok = <-lines:
			idle.Stop()
		case <-idle.C:
			w.drop() // silent too long: resume on a new connection
			continue
		case <-ctx.Done():
			idle.Stop()
			return nil, ctx.Err()
		}
		if !ok || l.err != nil {
			w.drop()
			continue
		}
		line := l.text
		if line == "" {
			if !any {
				continue
			}
			ev, err := w.event(id, event, strings.Join(data, "\n"))
			id, event, data, any = "", "", nil, false
			if err != nil {
				w.ended = err
				return nil, err
			}
			if ev != nil {
				return ev, nil
			}
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "id":
			id, any = value, true
		case "event":
			event, any = value, true
		case "data":
			data, any = append(data, value), true
		}
	}
}

func (w *Watch) event(id, kind, data string) (*ChangeEvent, error) {
	if id != "" {
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("snapfence: a watch event without a change id: %q", id)
		}
		w.last, w.hasLast = n, true
	}
	if data == "" || !changeKinds[kind] {
		return nil, nil // the stream's first block (an id alone), or a kind this client does not know
	}
	if id == "" {
		return nil, errors.New("snapfence: a watch event without a change id the watch could resume from")
	}
	ev := &ChangeEvent{ID: w.last, Kind: kind, Data: json.RawMessage(data)}
	if err := json.Unmarshal([]byte(data), ev); err != nil {
		return nil, fmt.Errorf("snapfence: the data of change %d (%s) is not the contract's JSON: %w", w.last, kind, err)
	}
	return ev, nil
}
