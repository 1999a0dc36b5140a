package snapfence

import (
	"context"
	"net/http"
	"strings"
)

type traceparentCtx struct{}

// traceContext is what ContextWithTraceparent put in a context: both "" when what it was given
// is not to be sent.
type traceContext struct {
	parent string
	state  string
}

// ContextWithTraceparent returns a context whose calls send traceparent, a W3C Trace Context
// traceparent ("00-" 32 hex digits of trace id "-" 16 of the caller's span id "-" 2 of flags),
// and tracestate unless it is "", on every request they make: each attempt of a call, and each
// connection of a Watch opened with it (and so the acquires and renewals of a coordination
// Keeper held with it). A service that exports traces makes its span of each request a child of
// that span; one that does not ignores the header.
//
// A traceparent that is not valid W3C (lowercase hex, a trace id and a span id that are not all
// zeros, version ff never) is not sent, nor its tracestate, and the calls go on without a trace
// context: tracing never fails a call. So is a tracestate that is not printable ASCII. "" sends
// none. The innermost ContextWithTraceparent of ctx applies, and it takes precedence over the
// traceparent of WithTraceContext's hook (a malformed one leaves the hook's).
func ContextWithTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	var tc traceContext
	if tp := strings.TrimSpace(traceparent); validTraceparent(tp) {
		tc.parent = tp
		if ts := strings.TrimSpace(tracestate); validTracestate(ts) {
			tc.state = ts
		}
	}
	return context.WithValue(ctx, traceparentCtx{}, tc)
}

// traceHeader is the trace context the requests of a call made with ctx carry (nil for none):
// what the WithTraceContext hook writes, then ContextWithTraceparent's traceparent over it.
func (c *Client) traceHeader(ctx context.Context) http.Header {
	var h http.Header
	if c.trace != nil {
		injected := http.Header{}
		c.trace(ctx, injected)
		for name, values := range injected {
			if !validHeaderName(name) {
				continue
			}
			var kept []string
			for _, v := range values {
				if validHeaderValue(v) {
					kept = append(kept, v)
				}
			}
			if len(kept) > 0 {
				if h == nil {
					h = http.Header{}
				}
				h[http.CanonicalHeaderKey(name)] = kept
			}
		}
	}
	if tc, _ := ctx.Value(traceparentCtx{}).(traceContext); tc.parent != "" {
		if h == nil {
			h = http.Header{}
		}
		h.Set("Traceparent", tc.parent)
		// A tracestate belongs to its traceparent: the hook's does not go with this one.
		h.Del("Tracestate")
		if tc.state != "" {
			h.Set("Tracestate", tc.state)
		}
	}
	return h
}

// validTraceparent checks a traceparent as W3C Trace Context level 1 says a receiver parses it:
// version 00 is exactly version-traceid-parentid-flags; a later version (not ff) is read by the
// same first 55 characters, and may go on after a "-".
func validTraceparent(s string) bool {
	if len(s) < 55 {
		return false
	}
	if len(s) > 55 && (s[:2] == "00" || s[55] != '-' || !validHeaderValue(s[55:])) {
		return false
	}
	for i := 0; i < 55; i++ {
		switch i {
		case 2, 35, 52:
			if s[i] != '-' {
				return false
			}
		default:
			if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
				return false
			}
		}
	}
	return s[:2] != "ff" && !allZeros(s[3:35]) && !allZeros(s[36:52])
}

func allZeros(hex string) bool { return strings.Trim(hex, "0") == "" }

// validTracestate: printable ASCII (the list's own syntax is the tracing system's business).
func validTracestate(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// validHeaderName: an HTTP token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		if b <= ' ' || b >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, b) >= 0 {
			return false
		}
	}
	return true
}

// validHeaderValue: no control characters but tab (what net/http would refuse to send).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; b < ' ' && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}
