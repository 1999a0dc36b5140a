package snapfence

import (
	"context"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RetryPolicy bounds how a Client repeats a request that got no definite answer.
//
// A request is sent again, with the same Idempotency-Key when it changes something, after:
//   - no connection could be made (nothing was sent);
//   - the connection broke, or the attempt timed out, before the whole answer arrived;
//   - 503 unavailable or 503 indeterminate, 429 too_many_requests, 409 request_in_progress,
//     or a gateway's 502/504 without a contract code.
//
// Each pause is a random duration (full jitter) of up to BaseDelay doubled per attempt, at most
// MaxDelay, and never shorter than the answer's Retry-After. Nothing else is retried: every
// other answer is definite.
type RetryPolicy struct {
	// MaxAttempts is how many times a request is sent at most, the first included. 1 disables
	// retries.
	MaxAttempts int
	// BaseDelay is the backoff's first ceiling.
	BaseDelay time.Duration
	// MaxDelay caps the backoff (not Retry-After).
	MaxDelay time.Duration
	// MaxRetryAfter is the longest Retry-After honoured: an answer that asks for a longer wait
	// is returned to the caller instead of being waited for.
	MaxRetryAfter time.Duration
}

// DefaultRetryPolicy is the policy of a Client made without WithRetry: 5 attempts, backoff from
// 100 ms up to 2 s, Retry-After honoured up to 30 s.
var DefaultRetryPolicy = RetryPolicy{
	MaxAttempts:   5,
	BaseDelay:     100 * time.Millisecond,
	MaxDelay:      2 * time.Second,
	MaxRetryAfter: 30 * time.Second,
}

// normalized fills the zero fields of p from DefaultRetryPolicy.
func (p RetryPolicy) normalized() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultRetryPolicy.MaxAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = DefaultRetryPolicy.BaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = DefaultRetryPolicy.MaxDelay
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = DefaultRetryPolicy.MaxRetryAfter
	}
	return p
}

var (
	jitterMu  sync.Mutex
	jitterRng = rand.New(rand.NewSource(time.Now().UnixNano()))
)

// backoff is the pause after the attempt-th failed attempt (from 1): full jitter under an
// exponentially growing ceiling.
func (p RetryPolicy) backoff(attempt int) time.Duration {
	ceiling := p.BaseDelay
	for i := 1; i < attempt && ceiling < p.MaxDelay; i++ {
		ceiling *= 2
	}
	if ceiling > p.MaxDelay {
		ceiling = p.MaxDelay
	}
	jitterMu.Lock()
	defer jitterMu.Unlock()
	return time.Duration(jitterRng.Int63n(int64(ceiling) + 1))
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP-date. 0 when absent or
// unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > 1<<31 {
			secs = 1 << 31
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := time.Parse(timeFormatHTTP, v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// timeFormatHTTP is the IMF-fixdate of HTTP (http.TimeFormat).
const timeFormatHTTP = "Mon, 02 Jan 2006 15:04:05 GMT"

// sleep waits d or until ctx is done, and reports whether it waited the whole d.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
