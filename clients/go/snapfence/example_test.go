package snapfence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// A client of a service with API keys and a private CA (compiled, not run).
func ExampleNew() {
	client, err := snapfence.New("https://snapfence.internal:7878",
		snapfence.WithAPIKey("sf_3_..."),                  // from `snapfence keys create`
		snapfence.WithCACertFile("/etc/snapfence/ca.pem"), // the private CA
		snapfence.WithTimeout(5*time.Second),              // per attempt
	)
	if err != nil {
		log.Fatal(err)
	}
	_ = client
}

// Take a lease, write under its token, read back, give the lease up.
func ExampleClient_PutSnapshot() {
	// SNAPFENCE_URL, SNAPFENCE_API_KEY and SNAPFENCE_CA_CERT, as for the CLI.
	client, err := snapfence.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	const key = "examples/reports/daily"
	grant, err := client.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "reporter-1", TTL: 30 * time.Second})
	var refused *snapfence.Error
	if errors.As(err, &refused) && refused.Code() == snapfence.CodeLeaseHeld {
		fmt.Printf("%s holds it until %v\n", refused.Holder.Owner, refused.Holder.ExpiresAt)
		return
	} else if err != nil {
		log.Fatal(err)
	}
	if _, err := client.PutSnapshot(ctx, key, grant.Token, []byte("the report"), snapfence.PutOptions{ContentType: "text/plain"}); err != nil {
		log.Fatal(err)
	}
	snap, err := client.GetSnapshot(ctx, key, snapfence.GetOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (%s), written with our token: %v\n", snap.Body, snap.ContentType, snap.Token == grant.Token)
	if err := client.Release(ctx, key, grant.Token); err != nil {
		log.Fatal(err)
	}
	// Output:
	// the report (text/plain), written with our token: true
}

// A holder that was superseded is refused, and the refusal is in the audit log.
func ExampleClient_ListRejections() {
	client, err := snapfence.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := "examples/jobs/" + snapfence.NewIdempotencyKey()
	old, err := client.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "worker-7", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	// worker-7 gives up (or its lease expires) and worker-8 takes over.
	if err := client.Release(ctx, key, old.Token); err != nil {
		log.Fatal(err)
	}
	if _, err := client.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "worker-8", TTL: 30 * time.Second}); err != nil {
		log.Fatal(err)
	}
	// worker-7 wakes up and writes with its old token.
	_, err = client.PutSnapshot(ctx, key, old.Token, []byte(`{"step":4}`), snapfence.PutOptions{})
	var refused *snapfence.Error
	if !errors.As(err, &refused) {
		log.Fatalf("not refused: %v", err)
	}
	fmt.Println(refused.Code())

	page, err := client.ListRejections(ctx, snapfence.AuditQuery{Key: key})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range page.Items {
		fmt.Printf("%s refused: %s, presented the old token: %v, key held by %s, same refusal: %v\n",
			r.Operation, r.Reason, r.PresentedToken == old.Token, r.Holder, r.ID == refused.AuditID)
	}
	// Output:
	// stale_token
	// put refused: stale_token, presented the old token: true, key held by worker-8, same refusal: true
}

// A snapshot written and read as JSON, and the watch that saw it.
func ExampleClient_PutJSON() {
	client, err := snapfence.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := fmt.Sprintf("examples/json/%d", time.Now().UnixNano())
	watch, err := client.Watch(ctx, snapfence.WatchOptions{Prefix: key})
	if err != nil {
		log.Fatal(err)
	}
	defer watch.Close()
	g, err := client.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "w", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.PutJSON(ctx, key, g.Lease.Token, map[string]int{"step": 3}, snapfence.PutOptions{}); err != nil {
		log.Fatal(err)
	}
	var state struct{ Step int }
	if _, err := client.GetJSON(ctx, key, &state); err != nil {
		log.Fatal(err)
	}
	fmt.Println("step", state.Step)
	for i := 0; i < 2; i++ {
		ev, err := watch.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.Kind, ev.Token == g.Lease.Token)
	}
	// Output:
	// step 3
	// lease.granted true
	// snapshot.written true
}
