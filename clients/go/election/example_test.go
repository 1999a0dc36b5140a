package election_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/snapfence/snapfence/clients/go/election"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// A candidate campaigns, leads, writes under its fence, and resigns.
func Example() {
	client, err := snapfence.NewFromEnv() // SNAPFENCE_URL, SNAPFENCE_API_KEY, SNAPFENCE_CA_CERT
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	e := election.New(client, fmt.Sprintf("examples/elections/%d", time.Now().UnixNano()), election.Options{TTL: 10 * time.Second})
	if err := e.Campaign(ctx, "node-a"); err != nil { // waits in the queue
		log.Fatal(err)
	}
	leader, err := e.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", leader.Owner, leader.Token == e.Fence().Token)
	if _, err := e.Proclaim(ctx, []byte("node-a's schedule"), "text/plain"); err != nil {
		log.Fatal(err)
	}
	if err := e.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = e.Leader(ctx)
	fmt.Println("after resigning:", err)
	// Output:
	// leader: node-a true
	// after resigning: election: no leader
}
