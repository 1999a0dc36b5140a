package execution_test

import (
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/snapfence/snapfence/clients/go/execution"
)

// Reserve a worktree for one execution, and give it back once its resources are cleaned up. The
// service is the one SNAPFENCE_URL (and SNAPFENCE_API_KEY) name, as for the snapfence CLI.
func ExampleAcquire() {
	dir, err := os.MkdirTemp("", "worktree-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	lease, err := execution.Acquire(dir, execution.Owner{Target: "staging", Kind: "deploy"})
	var conflict *execution.ConflictError
	if errors.As(err, &conflict) {
		fmt.Println("worktree busy, recovery required:", conflict.RecoveryRequired)
		return
	} else if err != nil {
		log.Fatal(err)
	}
	// A second execution is rejected at once, and names the owner.
	_, err = execution.Acquire(dir, execution.Owner{})
	if errors.As(err, &conflict) {
		fmt.Println(conflict.Code(), "by the same process:", conflict.Owner.PID == os.Getpid())
	}
	// ... mutate the worktree; lease.Context() is cancelled if the lease is lost ...
	if err := lease.Release(); err != nil { // cleanup confirmed: the record is cleared
		log.Fatal(err)
	}
	// Output:
	// resource_conflict by the same process: true
}

// After an execution crashed or abandoned the worktree, the next one reconciles what it left
// while holding the worktree, before taking over. (It needs a service with contract v1.2.)
func ExampleWithRecovery() {
	dir := "/srv/worktrees/db"
	reconcile := func(previous execution.Owner) error {
		// Establish that what previous (its PID, Target, Kind...) left no longer conflicts;
		// every other Acquire of dir is refused meanwhile.
		fmt.Println("reconciling the", previous.Kind, "of pid", previous.PID)
		return nil
	}
	lease, err := execution.Acquire(dir, execution.Owner{Kind: "migration"}, execution.WithRecovery(reconcile))
	var conflict *execution.ConflictError
	if errors.As(err, &conflict) && conflict.RecoveryRequired {
		log.Fatalf("the record stays: %v", conflict.Cause) // reconcile's error, for one
	} else if err != nil {
		log.Fatal(err)
	}
	defer lease.Release()
	// ... run the migration ...
}
