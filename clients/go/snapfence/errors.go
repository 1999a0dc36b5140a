package snapfence

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The contract's error codes, as Code() reports them.
const (
	CodeInvalidRequest       = "invalid_request"
	CodeTokenRequired        = "token_required"
	CodeLeaseHeld            = "lease_held"
	CodeRecoveryRequired     = "recovery_required"
	CodeLeaseLost            = "lease_lost"
	CodeStaleToken           = "stale_token"
	CodeUnknownToken         = "unknown_token"
	CodePreconditionFailed   = "precondition_failed"
	CodeNotFound             = "not_found"
	CodePayloadTooLarge      = "payload_too_large"
	CodeUnauthorized         = "unauthorized"
	CodeForbidden            = "forbidden"
	CodeUnavailable          = "unavailable"
	CodeIndeterminate        = "indeterminate"
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	CodeRequestInProgress    = "request_in_progress"
	CodeTooManyRequests      = "too_many_requests"
	CodeCompacted            = "compacted"
	// CodeMethodNotAllowed, CodeRequestTimeout and CodeInternal are answered by the server
	// beyond the contract's list (see openapi.yaml).
	CodeMethodNotAllowed = "method_not_allowed"
	CodeRequestTimeout   = "request_timeout"
	CodeInternal         = "internal"
)

// Sentinels for errors.Is: errors.Is(err, ErrStaleToken) is true for an *Error (or a
// *TransportError) whose Code() is that code.
var (
	ErrInvalidRequest       error = codeSentinel(CodeInvalidRequest)
	ErrTokenRequired        error = codeSentinel(CodeTokenRequired)
	ErrLeaseHeld            error = codeSentinel(CodeLeaseHeld)
	ErrRecoveryRequired     error = codeSentinel(CodeRecoveryRequired)
	ErrLeaseLost            error = codeSentinel(CodeLeaseLost)
	ErrStaleToken           error = codeSentinel(CodeStaleToken)
	ErrUnknownToken         error = codeSentinel(CodeUnknownToken)
	ErrPreconditionFailed   error = codeSentinel(CodePreconditionFailed)
	ErrNotFound             error = codeSentinel(CodeNotFound)
	ErrPayloadTooLarge      error = codeSentinel(CodePayloadTooLarge)
	ErrUnauthorized         error = codeSentinel(CodeUnauthorized)
	ErrForbidden            error = codeSentinel(CodeForbidden)
	ErrUnavailable          error = codeSentinel(CodeUnavailable)
	ErrIndeterminate        error = codeSentinel(CodeIndeterminate)
	ErrIdempotencyKeyReused error = codeSentinel(CodeIdempotencyKeyReused)
	ErrRequestInProgress    error = codeSentinel(CodeRequestInProgress)
	ErrTooManyRequests      error = codeSentinel(CodeTooManyRequests)
	ErrCompacted            error = codeSentinel(CodeCompacted)
	ErrMethodNotAllowed     error = codeSentinel(CodeMethodNotAllowed)
	ErrRequestTimeout       error = codeSentinel(CodeRequestTimeout)
	ErrInternal             error = codeSentinel(CodeInternal)
)

// codeSentinel is the type of the Err* sentinels: a code and nothing else.
type codeSentinel string

func (s codeSentinel) Error() string { return "snapfence: " + string(s) }

// Code is the sentinel's code.
func (s codeSentinel) Code() string { return string(s) }

// CodeOf returns the contract code of err: the Code() of the first error in its chain that has
// one, or "" when none has.
func CodeOf(err error) string {
	var coded interface{ Code() string }
	if errors.As(err, &coded) {
		return coded.Code()
	}
	return ""
}

// Error is an error answer of the service (an RFC 9457 problem), or a refusal made by the client
// before anything was sent (Status 0, code invalid_request).
type Error struct {
	// Status is the HTTP status; 0 for a refusal made by the client itself.
	Status int
	// Type, Title and Detail are the problem's fields. Detail explains what went wrong and what
	// to do, for people; match on Code(), not on it.
	Type, Title, Detail string
	// Method and URL name the request.
	Method, URL string
	// RequestID is the answer's x-request-id.
	RequestID string
	// Holder is set for lease_held: who holds the key, until when; on a free key that goes to
	// waiting acquires queued first, who held it last.
	Holder *Holder
	// State is set for lease_held (by servers that say it): the key's state as the acquire
	// found it, StateHeld or the free state of a key that goes to Waiters.
	State string
	// Waiters is set for lease_held on a free key: how many waiting acquires are queued first.
	Waiters int64
	// Recovery is set for recovery_required: the retained record.
	Recovery *RecoveryRecord
	// PresentedToken, HighestToken and AuditID are set for stale_token and unknown_token
	// (HighestToken is 0 for a key that was never leased).
	PresentedToken, HighestToken uint64
	// AuditID is the refusal's row in the audit log (ListRejections).
	AuditID int64
	// Key and FencingKey are set for a refused write that named a fence (contract v1.3): the
	// key it failed on and the fence.
	Key, FencingKey string
	// OpIndex is the index of the transaction op whose precondition failed (contract v1.3), or
	// -1.
	OpIndex int
	// RetryAfter is the Retry-After header, or 0.
	RetryAfter time.Duration
	// IdempotencyKey is the Idempotency-Key the request carried ("" for a read). Repeat a
	// changing call with it (WithIdempotencyKey) to learn what the first one did.
	IdempotencyKey string
	// Attempts is how many times the request was sent.
	Attempts int
	// Body is the raw answer body.
	Body []byte

	code string
}

// Code is the contract's machine-readable code (CodeLeaseHeld, ...), or "" for an answer that
// carried none (e.g. a proxy's 502).
func (e *Error) Code() string { return e.code }

// Error describes the refusal with its code, status and the server's explanation.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("snapfence: ")
	if e.code != "" {
		b.WriteString(e.code)
	} else {
		b.WriteString("error")
	}
	if e.Status != 0 {
		fmt.Fprintf(&b, " (%d)", e.Status)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	} else if e.Title != "" {
		b.WriteString(": ")
		b.WriteString(e.Title)
	}
	return b.String()
}

// Is reports whether target is the sentinel of e's code (ErrLeaseHeld, ...).
func (e *Error) Is(target error) bool {
	s, ok := target.(codeSentinel)
	return ok && string(s) == e.code
}

// Retryable reports whether the contract allows sending the same request again (with the same
// Idempotency-Key): 503 unavailable or indeterminate, 429 too_many_requests, 409
// request_in_progress, or a gateway's 502/504.
func (e *Error) Retryable() bool {
	switch e.code {
	case CodeUnavailable, CodeIndeterminate, CodeTooManyRequests, CodeRequestInProgress:
		return true
	case "":
		return e.Status == http.StatusBadGateway || e.Status == http.StatusServiceUnavailable ||
			e.Status == http.StatusGatewayTimeout
	}
	return false
}

// problem is the wire form of an error answer.
type problem struct {
	Type           string          `json:"type"`
	Title          string          `json:"title"`
	Status         int             `json:"status"`
	Detail         string          `json:"detail"`
	Code           string          `json:"code"`
	Holder         *Holder         `json:"holder"`
	State          string          `json:"state"`
	Waiters        int64           `json:"waiters"`
	Recovery       *RecoveryRecord `json:"recovery"`
	PresentedToken uint64          `json:"presented_token"`
	HighestToken   uint64          `json:"highest_token"`
	AuditID        int64           `json:"audit_id"`
	Key            string          `json:"key"`
	FencingKey     string          `json:"fencing_key"`
	OpIndex        *int            `json:"op_index"`
}

// codeOfStatus names the code of a bodiless error answer (HEAD) by its status.
func codeOfStatus(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestHeaderFieldsTooLarge:
		return CodeInvalidRequest
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusForbidden:
		return CodeForbidden
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusPreconditionFailed:
		return CodePreconditionFailed
	case http.StatusPreconditionRequired:
		return CodeTokenRequired
	case http.StatusRequestEntityTooLarge:
		return CodePayloadTooLarge
	case http.StatusTooManyRequests:
		return CodeTooManyRequests
	case http.StatusInternalServerError:
		return CodeInternal
	case http.StatusServiceUnavailable:
		return CodeUnavailable
	}
	return ""
}

// newAPIError reads an error answer.
func newAPIError(method, url string, status int, header http.Header, body []byte) *Error {
	e := &Error{
		Status:     status,
		Method:     method,
		URL:        url,
		RequestID:  header.Get("X-Request-Id"),
		RetryAfter: parseRetryAfter(header.Get("Retry-After"), time.Now()),
		Body:       body,
		OpIndex:    -1,
	}
	var p problem
	if len(body) > 0 && json.Unmarshal(body, &p) == nil && p.Code != "" {
		e.code = p.Code
		e.Type, e.Title, e.Detail = p.Type, p.Title, p.Detail
		e.Holder, e.Recovery = p.Holder, p.Recovery
		e.State, e.Waiters = p.State, p.Waiters
		e.PresentedToken, e.HighestToken, e.AuditID = p.PresentedToken, p.HighestToken, p.AuditID
		e.Key, e.FencingKey = p.Key, p.FencingKey
		if p.OpIndex != nil {
			e.OpIndex = *p.OpIndex
		}
		return e
	}
	e.Title = http.StatusText(status)
	if len(body) == 0 && method == http.MethodHead {
		e.code = codeOfStatus(status)
		e.Detail = "answered " + e.Title + " to HEAD (no body)"
	} else if len(body) > 0 {
		e.Detail = "unexpected answer: " + truncate(string(body), 200)
	}
	return e
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// invalid is a refusal made by the client before sending anything.
func invalid(format string, args ...any) *Error {
	return &Error{code: CodeInvalidRequest, Detail: fmt.Sprintf(format, args...), OpIndex: -1}
}

// TransportError is a request that got no answer from the service: no connection could be
// made, or the connection broke (or the attempt timed out) before the whole answer arrived.
type TransportError struct {
	// Method and URL name the request.
	Method, URL string
	// Sent is true when the request may have reached the service: its outcome is then unknown,
	// and Code() is CodeIndeterminate. False when no connection could be made (nothing was
	// sent; Code() is CodeUnavailable).
	Sent bool
	// IdempotencyKey is the Idempotency-Key the request carried ("" for a read). Repeat the call
	// with it (WithIdempotencyKey) to learn what the first one did.
	IdempotencyKey string
	// Attempts is how many times the request was sent.
	Attempts int
	// Err is the underlying error (from net/http, or the context's).
	Err error
}

// Code is CodeIndeterminate when the request may have reached the service, else
// CodeUnavailable: the contract's meaning of each (outcome unknown; nothing changed).
func (e *TransportError) Code() string {
	if e.Sent {
		return CodeIndeterminate
	}
	return CodeUnavailable
}

// Error says what failed and whether the request may have had an effect.
func (e *TransportError) Error() string {
	what := "could not reach the server, so nothing was sent"
	if e.Sent {
		what = "no answer from the server: the request may or may not have taken effect"
		if e.IdempotencyKey != "" {
			what += " (repeat it with Idempotency-Key " + e.IdempotencyKey + " to find out)"
		}
	}
	return fmt.Sprintf("snapfence: %s %s: %s: %v", e.Method, e.URL, what, e.Err)
}

// Unwrap returns the underlying error.
func (e *TransportError) Unwrap() error { return e.Err }

// Is reports whether target is the sentinel of e's code (ErrIndeterminate or ErrUnavailable).
func (e *TransportError) Is(target error) bool {
	s, ok := target.(codeSentinel)
	return ok && string(s) == e.Code()
}
