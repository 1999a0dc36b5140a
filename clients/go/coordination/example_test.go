package coordination_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// The Locker in use: take the lease, save under its token, give it back.
func ExampleNewLocker() {
	client, err := snapfence.NewFromEnv() // SNAPFENCE_URL, SNAPFENCE_API_KEY, SNAPFENCE_CA_CERT
	if err != nil {
		log.Fatal(err)
	}
	var locker coordination.Locker = coordination.NewLocker(client)
	snapshots := coordination.NewSnapshots(client, "application/json")
	ctx := context.Background()

	lease, ok, err := locker.Acquire(ctx, "examples/runs/42", "worker-7", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	if !ok {
		fmt.Println("another worker holds the run")
		return
	}
	defer locker.Release(ctx, lease)
	if _, err := snapshots.Save(ctx, lease, []byte(`{"step":3}`)); errors.Is(err, coordination.ErrRunLeaseLost) {
		log.Fatal("superseded: stop working on the run")
	} else if err != nil {
		log.Fatal(err)
	}
	state, _, err := snapshots.Load(ctx, "examples/runs/42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("saved %s with token %v\n", state.Data, state.Token == lease.Token)
	// Output:
	// saved {"step":3} with token true
}

// A Keeper renews the lease while the work runs, and cancels the work's context before the lease
// could expire if it is lost.
func ExampleHold() {
	client, err := snapfence.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	keeper, ok, err := coordination.Hold(ctx, coordination.NewLocker(client), "examples/runs/43", "worker-7",
		15*time.Second, coordination.KeeperOptions{Margin: 3 * time.Second})
	if err != nil || !ok {
		log.Fatal("not acquired: ", err)
	}
	work := keeper.Context()
	select {
	case <-work.Done():
		// Stop at once: within the margin another worker may be granted the run.
		fmt.Println("stopped:", coordination.Cause(work))
	case <-time.After(100 * time.Millisecond): // the work
		fmt.Println("done, lease held:", keeper.Err() == nil)
	}
	if err := keeper.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// done, lease held: true
}
