package snapfence_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// newClient is a client of the shared server.
func newClient(t *testing.T, opts ...snapfence.Option) *snapfence.Client {
	t.Helper()
	c, err := snapfence.New(testenv.Shared.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wantCode fails unless err is an *Error with code, and returns it.
func wantCode(t *testing.T, err error, code string) *snapfence.Error {
	t.Helper()
	var e *snapfence.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a *snapfence.Error with code %s, got %T: %v", code, err, err)
	}
	if e.Code() != code {
		t.Fatalf("want code %s, got %s: %v", code, e.Code(), err)
	}
	if snapfence.CodeOf(err) != code {
		t.Fatalf("CodeOf = %q, want %q", snapfence.CodeOf(err), code)
	}
	return e
}

// acquire takes a plain lease on key and fails the test if it is not granted.
func acquire(t *testing.T, c *snapfence.Client, key, owner string, ttl time.Duration) *snapfence.Grant {
	t.Helper()
	g, err := c.Acquire(testenv.Context(t), key, snapfence.AcquireRequest{Owner: owner, TTL: ttl})
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return g
}
