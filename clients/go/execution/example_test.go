package execution_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/snapfence/snapfence/clients/go/execution"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// Reserve a worktree for one execution, and give it back once its resources are cleaned up.
func ExampleAcquire() {
	client, err := snapfence.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	dir := filepath.Join(os.TempDir(), "examples", "worktree-a")
	lease, err := execution.Acquire(context.Background(), client, dir, execution.Owner{Target: "staging", Kind: "deploy"})
	var conflict *execution.ConflictError
	if errors.As(err, &conflict) {
		fmt.Println("worktree busy:", conflict.Code())
		return
	} else if err != nil {
		log.Fatal(err)
	}
	// A second execution is rejected at once, and names the owner.
	_, err = execution.Acquire(context.Background(), client, dir, execution.Owner{})
	if errors.As(err, &conflict) {
		fmt.Println(conflict.Code(), "by the same process:", conflict.Owner.PID == os.Getpid())
	}
	work := lease.Context() // cancelled if the lease is lost
	_ = work
	// ... mutate the worktree, fenced writes with lease.Token() ...
	if err := lease.Release(); err != nil { // cleanup confirmed: the record is cleared
		log.Fatal(err)
	}
	// Output:
	// lease_held by the same process: true
}

// After an execution crashed or abandoned the worktree, the next one reconciles what it left
// before taking over.
func ExampleWithRecovery() {
	client, err := snapfence.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	dir := filepath.Join(os.TempDir(), "examples", "worktree-b")
	first, err := execution.Acquire(ctx, client, dir, execution.Owner{Kind: "migration"})
	if err != nil {
		log.Fatal(err)
	}
	if err := first.Abandon(); err != nil { // half done: keep the record
		log.Fatal(err)
	}

	reconcile := func(ctx context.Context, previous execution.Owner) error {
		// Establish that what previous (its PID, Target, Kind...) left no longer conflicts.
		fmt.Println("reconciling the", previous.Kind, "of the same process:", previous.PID == os.Getpid())
		return nil
	}
	next, err := execution.Acquire(ctx, client, dir, execution.Owner{Kind: "migration"}, execution.WithRecovery(reconcile))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("replaced a record left", next.Recovered().Reason)
	if err := next.Release(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// reconciling the migration of the same process: true
	// replaced a record left abandoned
}
