// Package snapfence is a client of a snapfence service: leases with fencing tokens, fenced
// snapshot writes, and the audit log of refused writes, over the HTTP contract (API.md).
//
// A Client has one method per endpoint. Error answers are *Error values whose Code() is the
// contract's code (CodeLeaseHeld, CodeStaleToken, ...), with the code's fields (Holder,
// Recovery, PresentedToken, HighestToken, AuditID); requests that got no answer are
// *TransportError values whose Code() is CodeIndeterminate (the request may have taken effect)
// or CodeUnavailable (nothing was sent). errors.Is(err, ErrStaleToken) and CodeOf(err) match
// either.
//
// Every changing call carries an Idempotency-Key, the same on each of its attempts, and calls
// are retried as RetryPolicy describes (503 unavailable and indeterminate, lost answers,
// Retry-After honoured, bounded). API keys (WithAPIKey) are sent as Bearer tokens; a server
// with a private CA is trusted with WithCACertFile, WithCACertPEM or WithRootCAs.
//
// A caller's W3C trace context goes with every request of its calls, so that a server exporting
// traces makes its request spans children of the caller's span: ContextWithTraceparent for a
// traceparent in hand, or WithTraceContext to plug in a tracing library's propagator.
//
// The coordination and execution packages of this module build a Locker, a lease keeper and a
// worktree lease with recovery on this client.
package snapfence
