package coordination_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// childEnv names the child's role when the test binary runs as a paused holder.
const childEnv = "SNAPFENCE_COORDINATION_CHILD"

func TestAGrantAfterALongWaitRunsItsWorkToTheEnd(t *testing.T) {
	c := newClient(t)
	locker := coordination.NewLocker(c)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	first, _, err := locker.Acquire(ctx, key, "first", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	released := time.AfterFunc(4*time.Second, func() { _ = locker.Release(context.Background(), first) })
	defer released.Stop()

	started := time.Now()
	k, ok, err := coordination.Hold(ctx, locker, key, "waiter", 2*time.Second, coordination.KeeperOptions{Wait: 20 * time.Second})
	if err != nil || !ok {
		t.Fatalf("hold: %v %v", ok, err)
	}
	if waited := time.Since(started); waited < 3500*time.Millisecond {
		t.Fatalf("granted after %v: the holder had the key for 4 s", waited)
	}
	// Work of 1.5 TTLs, checking often: nothing says the lease is lost.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err := k.Err(); err != nil {
			t.Fatalf("a grant after a wait reported lost: %v", err)
		}
		if k.Context().Err() != nil {
			t.Fatal("the keeper's context ended while the lease was held")
		}
	}
	if _, err := c.PutSnapshot(ctx, key, k.Lease().Token, []byte("finished"), snapfence.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{})
	if err != nil || string(s.Body) != "finished" {
		t.Fatalf("%+v %v", s, err)
	}
}

func TestHoldWaitingNeedsAWaitingLocker(t *testing.T) {
	_, _, err := coordination.Hold(testenv.Context(t), lockerOnly{coordination.NewLocker(newClient(t))}, "k", "w", time.Second, coordination.KeeperOptions{Wait: time.Second})
	if err == nil {
		t.Fatal("a Locker that cannot wait was asked to")
	}
}

type lockerOnly struct{ coordination.Locker }

// The child: holds a key with a TTL of 2 s, writes once, says its token, then waits for a line
// on stdin (the parent pauses it past the TTL meanwhile) and checks before writing again.
func runChild() int {
	ctx := context.Background()
	c, err := snapfence.New(os.Getenv("SNAPFENCE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	key := os.Getenv(childEnv)
	k, ok, err := coordination.Hold(ctx, coordination.NewLocker(c), key, "frozen", 2*time.Second, coordination.KeeperOptions{RenewEvery: 300 * time.Millisecond})
	if err != nil || !ok {
		fmt.Fprintln(os.Stderr, "hold:", ok, err)
		return 1
	}
	if _, err := c.PutSnapshot(ctx, key, k.Lease().Token, []byte("before the freeze"), snapfence.PutOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{"token": k.Lease().Token})
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	if err := k.Err(); err != nil {
		_ = out.Encode(map[string]any{"write": "not sent", "lease_lost": errors.Is(err, snapfence.ErrLeaseLost) && errors.Is(err, coordination.ErrRunLeaseLost), "context_ended": k.Context().Err() != nil})
		return 0
	}
	_, err = c.PutSnapshot(ctx, key, k.Lease().Token, []byte("after the freeze"), snapfence.PutOptions{})
	_ = out.Encode(map[string]any{"write": "sent", "error": fmt.Sprint(err)})
	return 0
}

func TestAReleasedLeaseIsNotReportedLostWhenItsTTLPasses(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	k, ok, err := coordination.Hold(ctx, coordination.NewLocker(c), testenv.UniqueKey(t, "k"), "w", time.Second, coordination.KeeperOptions{})
	if err != nil || !ok {
		t.Fatalf("hold: %v %v", ok, err)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	if err := k.Err(); err != nil {
		t.Fatalf("a released lease reported lost: %v", err)
	}
}
