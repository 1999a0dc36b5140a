package snapfence

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Version is this client's version, sent in its User-Agent.
const Version = "0.1.0"

// DefaultURL is the address of a snapfence server started with its defaults.
const DefaultURL = "http://127.0.0.1:7878"

// DefaultTimeout bounds each attempt of a request when WithTimeout is not given.
const DefaultTimeout = 10 * time.Second

// Client talks to one snapfence service. It is safe for concurrent use; make one and share it.
//
// Every call that changes something (Acquire, Renew, Release, Abandon, RequireRecovery, Reconciled,
// PutSnapshot, DeleteSnapshot) carries an Idempotency-Key, the same on each of its attempts, and
// is retried by the client's RetryPolicy after an answer that the contract says may be retried.
// The key lets a service that implements Idempotency-Key apply the change exactly once.
type Client struct {
	base      string
	http      *http.Client
	apiKey    string
	timeout   time.Duration
	retry     RetryPolicy
	userAgent string
	trace     func(ctx context.Context, header http.Header)
}

// Option configures a Client made by New or NewFromEnv.
type Option func(*config) error

type config struct {
	apiKey     string
	roots      *x509.CertPool
	httpClient *http.Client
	timeout    time.Duration
	retry      RetryPolicy
	userAgent  string
	trace      func(ctx context.Context, header http.Header)
}

// WithAPIKey sends key (the sf_... token of `snapfence keys create`) as a Bearer token on every
// call. Without it, no Authorization header is sent.
func WithAPIKey(key string) Option {
	return func(c *config) error {
		if strings.ContainsAny(key, "\r\n") {
			return errors.New("snapfence: the API key contains a line break")
		}
		c.apiKey = strings.TrimSpace(key)
		return nil
	}
}

// WithRootCAs trusts exactly the certificates of pool for an https:// server (a private CA),
// instead of the system's roots.
func WithRootCAs(pool *x509.CertPool) Option {
	return func(c *config) error {
		if pool == nil {
			return errors.New("snapfence: WithRootCAs needs a certificate pool")
		}
		c.roots = pool
		return nil
	}
}

// WithCACertPEM trusts exactly the PEM certificates in pemCerts (a private CA) for an https://
// server, instead of the system's roots.
func WithCACertPEM(pemCerts []byte) Option {
	return func(c *config) error {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemCerts) {
			return errors.New("snapfence: no PEM certificate found for WithCACertPEM")
		}
		c.roots = pool
		return nil
	}
}

// WithCACertFile is WithCACertPEM with the PEM certificates read from the file at path (what the
// CLI's --ca-cert and SNAPFENCE_CA_CERT take).
func WithCACertFile(path string) Option {
	return func(c *config) error {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("snapfence: reading the CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return fmt.Errorf("snapfence: no PEM certificate found in %s", path)
		}
		c.roots = pool
		return nil
	}
}

// WithHTTPClient sends the requests with hc (for a proxy, custom dialing or instrumentation).
// It cannot be combined with the CA options, which configure the client's own transport; give
// hc's transport its TLS configuration instead. hc's Timeout, if any, applies on top of
// WithTimeout.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *config) error {
		if hc == nil {
			return errors.New("snapfence: WithHTTPClient needs a client")
		}
		c.httpClient = hc
		return nil
	}
}

// WithTimeout bounds each attempt of a request (DefaultTimeout without it). An attempt that runs
// out is treated as a lost answer: retried, with the same Idempotency-Key, by the RetryPolicy.
// The context passed to a call bounds all attempts together.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return errors.New("snapfence: the timeout must be positive")
		}
		c.timeout = d
		return nil
	}
}

// WithRetry replaces DefaultRetryPolicy; zero fields keep their defaults.
func WithRetry(p RetryPolicy) Option {
	return func(c *config) error {
		c.retry = p.normalized()
		return nil
	}
}

// WithUserAgent sets the User-Agent header (default "snapfence-go/<Version>").
func WithUserAgent(ua string) Option {
	return func(c *config) error {
		c.userAgent = ua
		return nil
	}
}

// WithTraceContext has inject write the trace context of each call's ctx into header, for the
// call's requests (all its attempts; a Watch's connections, with the ctx given to Watch): the
// hook of a tracing library's propagator, so this module needs no tracing dependency. With
// OpenTelemetry:
//
//	snapfence.WithTraceContext(func(ctx context.Context, h http.Header) {
//		otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
//	})
//
// header starts empty for each call; what inject leaves in it is sent, except header fields
// that are not valid HTTP (they are dropped) and the client's own headers (Authorization,
// Idempotency-Key, Content-Type, ...), which it cannot replace. A traceparent given with
// ContextWithTraceparent takes precedence over the one inject writes.
func WithTraceContext(inject func(ctx context.Context, header http.Header)) Option {
	return func(c *config) error {
		if inject == nil {
			return errors.New("snapfence: WithTraceContext needs a function")
		}
		c.trace = inject
		return nil
	}
}

// New makes a client of the service at baseURL (e.g. "http://127.0.0.1:7878", or an https://
// address; a path prefix is kept).
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("snapfence: bad server URL %q: %w", baseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("snapfence: bad server URL %q: want http://host:port or https://host:port", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("snapfence: bad server URL %q: no query or fragment allowed", baseURL)
	}
	cfg := config{
		timeout:   DefaultTimeout,
		retry:     DefaultRetryPolicy,
		userAgent: "snapfence-go/" + Version,
	}
	for _, opt := range opts {
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	hc := cfg.httpClient
	if hc != nil && cfg.roots != nil {
		return nil, errors.New("snapfence: WithHTTPClient cannot be combined with a CA option; configure its transport's TLS instead")
	}
	if hc == nil {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: cfg.roots}
		hc = &http.Client{Transport: transport}
	}
	return &Client{
		base:      strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"),
		http:      hc,
		apiKey:    cfg.apiKey,
		timeout:   cfg.timeout,
		retry:     cfg.retry,
		userAgent: cfg.userAgent,
		trace:     cfg.trace,
	}, nil
}

// NewFromEnv makes a client from the environment the snapfence CLI (and `snapfence run`) uses:
// SNAPFENCE_URL (default DefaultURL), SNAPFENCE_API_KEY and SNAPFENCE_CA_CERT (a PEM file).
// opts are applied after those.
func NewFromEnv(opts ...Option) (*Client, error) {
	base := os.Getenv("SNAPFENCE_URL")
	if base == "" {
		base = DefaultURL
	}
	var all []Option
	if key := os.Getenv("SNAPFENCE_API_KEY"); key != "" {
		all = append(all, WithAPIKey(key))
	}
	if ca := os.Getenv("SNAPFENCE_CA_CERT"); ca != "" {
		all = append(all, WithCACertFile(ca))
	}
	return New(base, append(all, opts...)...)
}

// URL is the service's base URL as the client uses it.
func (c *Client) URL() string { return c.base }

type idempotencyKeyCtx struct{}

// WithIdempotencyKey returns a context that makes the next changing call made with it send key as
// its Idempotency-Key instead of a new random one: to repeat, after a restart, a call whose
// outcome is unknown (see TransportError.IdempotencyKey), so that a service that implements
// Idempotency-Key answers what the first call did. Use it for one call only: the same key with a
// different request is refused (idempotency_key_reused). key must be 1..=255 visible ASCII
// characters.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKeyCtx{}, key)
}

// NewIdempotencyKey returns a new random Idempotency-Key (128 bits, hex).
func NewIdempotencyKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on the systems Go supports; a time-based key still
		// separates calls.
		return fmt.Sprintf("t%x", time.Now().UnixNano())
	}
	return hex.EncodeToString(b[:])
}

func validIdempotencyKey(key string) bool {
	if len(key) == 0 || len(key) > 255 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < '!' || key[i] > '~' {
			return false
		}
	}
	return true
}

// request is one call, as sent on every attempt.
type request struct {
	method   string
	path     string // escaped, from the base URL on: "/v1/leases/jobs%2F42"
	query    url.Values
	header   http.Header
	body     []byte
	changing bool // carries an Idempotency-Key
	// wait is how long the server may hold the call before it answers (a waiting acquire's
	// Wait): each attempt's timeout is the client's plus it, so a wait is never cut off and
	// sent again.
	wait time.Duration
}

// answer is the definite answer of a call.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// keyPath escapes key as one path segment after prefix (and before suffix).
func keyPath(prefix, key, suffix string) (string, error) {
	if key == "" {
		return "", invalid("the key is empty (a key is 1..=512 bytes of UTF-8)")
	}
	return prefix + url.PathEscape(key) + suffix, nil
}

// send runs r, retrying as the RetryPolicy allows, and returns its answer if its status is one of
// ok, else the error.
func (c *Client) send(ctx context.Context, r request, ok ...int) (*answer, error) {
	target := c.base + r.path
	if len(r.query) > 0 {
		target += "?" + r.query.Encode()
	}
	idemKey := ""
	if r.changing {
		if k, _ := ctx.Value(idempotencyKeyCtx{}).(string); k != "" {
			if !validIdempotencyKey(k) {
				return nil, invalid("the Idempotency-Key %q is not 1..=255 visible ASCII characters", k)
			}
			idemKey = k
		} else {
			idemKey = NewIdempotencyKey()
		}
	}
	trace := c.traceHeader(ctx)
	var last error
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return nil, last
			}
			return nil, &TransportError{Method: r.method, URL: target, IdempotencyKey: idemKey, Attempts: attempt - 1, Err: err}
		}
		a, err := c.attempt(ctx, r, target, idemKey, trace)
		var delay time.Duration
		if err != nil {
			err.Attempts = attempt
			last = err
			if !retryableTransport(err) || attempt >= c.retry.MaxAttempts || ctx.Err() != nil {
				return nil, err
			}
		} else {
			for _, s := range ok {
				if a.status == s {
					return a, nil
				}
			}
			apiErr := newAPIError(r.method, target, a.status, a.header, a.body)
			apiErr.IdempotencyKey = idemKey
			apiErr.Attempts = attempt
			last = apiErr
			if !apiErr.Retryable() || attempt >= c.retry.MaxAttempts || apiErr.RetryAfter > c.retry.MaxRetryAfter {
				return nil, apiErr
			}
			delay = apiErr.RetryAfter
		}
		if b := c.retry.backoff(attempt); b > delay {
			delay = b
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < delay {
			return nil, last
		}
		if !sleep(ctx, delay) {
			return nil, last
		}
	}
}

// callJSON sends r and decodes its 200 answer into a T: the calls whose success is one JSON
// object (a lease, a status, a page).
func callJSON[T any](ctx context.Context, c *Client, r request) (*T, error) {
	a, err := c.send(ctx, r, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var v T
	if err := decode(a, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// attempt sends r once, with the call's trace context (traceHeader).
func (c *Client) attempt(ctx context.Context, r request, target, idemKey string, trace http.Header) (*answer, *TransportError) {
	actx, cancel := context.WithTimeout(ctx, c.timeout+r.wait)
	defer cancel()
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(actx, r.method, target, body)
	if err != nil {
		return nil, &TransportError{Method: r.method, URL: target, Err: err}
	}
	for name, values := range trace {
		req.Header[name] = values
	}
	for name, values := range r.header {
		req.Header[name] = values
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &TransportError{Method: r.method, URL: target, IdempotencyKey: idemKey, Sent: mayHaveBeenSent(err), Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, &TransportError{Method: r.method, URL: target, IdempotencyKey: idemKey, Sent: true, Err: err}
	}
	return &answer{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

// mayHaveBeenSent is false only for failures that happen before a request can reach the server:
// dialing, name resolution and the TLS handshake.
func mayHaveBeenSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return false
	}
	return !isTLSFailure(err)
}

// isTLSFailure reports a certificate or TLS protocol failure: retrying cannot help.
func isTLSFailure(err error) bool {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalidCert x509.CertificateInvalidError
	var record tls.RecordHeaderError
	if errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalidCert) || errors.As(err, &record) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "tls: ") || strings.Contains(msg, "server gave HTTP response to HTTPS client")
}

// retryableTransport: any failure to get an answer may be retried, except a TLS failure (it
// would fail the same way) and the caller's own context ending.
func retryableTransport(e *TransportError) bool {
	if isTLSFailure(e.Err) {
		return false
	}
	return true
}

// decode reads a JSON answer into v.
func decode(a *answer, v any) error {
	if err := json.Unmarshal(a.body, v); err != nil {
		return fmt.Errorf("snapfence: unreadable answer (status %d): %w", a.status, err)
	}
	return nil
}

// jsonHeader is the header of a JSON request body.
func jsonHeader() http.Header {
	return http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json"}}
}

func tokenHeader(token uint64) (http.Header, error) {
	if token == 0 || token > 1<<63-1 {
		return nil, invalid("fencing token %d is out of range (1..=9223372036854775807)", token)
	}
	return http.Header{"Fencing-Token": {fmt.Sprint(token)}}, nil
}
