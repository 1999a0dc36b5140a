package election_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/election"
	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// candidateEnv names the election when the test binary runs as a candidate process.
const candidateEnv = "SNAPFENCE_ELECTION_CANDIDATE"

func TestMain(m *testing.M) {
	if name := os.Getenv(candidateEnv); name != "" {
		os.Exit(runCandidate(name, os.Getenv(candidateEnv+"_ME")))
	}
	os.Exit(testenv.Main(m))
}

func newClient(t *testing.T) *snapfence.Client {
	t.Helper()
	c, err := snapfence.New(testenv.Shared.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// candidateTTL is the lease TTL of the candidate processes.
const candidateTTL = 2 * time.Second

// runCandidate campaigns, writes once as the leader, then makes a write (without checking
// anything, as a deposed leader would) for each line on stdin, saying what happens as JSON
// lines.
func runCandidate(name, me string) int {
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	say := func(v map[string]any) {
		mu.Lock()
		defer mu.Unlock()
		_ = out.Encode(v)
	}
	c, err := snapfence.New(os.Getenv("SNAPFENCE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	e := election.New(c, name, election.Options{TTL: candidateTTL, RenewEvery: candidateTTL / 6})
	say(map[string]any{"event": "campaigning"})
	if err := e.Campaign(ctx, me); err != nil {
		fmt.Fprintln(os.Stderr, "campaign:", err)
		return 1
	}
	say(map[string]any{"event": "leader", "token": e.Token()})
	go func() {
		<-e.Done()
		say(map[string]any{"event": "lost", "error": fmt.Sprint(e.Err())})
	}()
	if _, err := e.Proclaim(ctx, []byte(me), "text/plain"); err != nil {
		fmt.Fprintln(os.Stderr, "first write:", err)
		return 1
	}
	say(map[string]any{"event": "wrote"})
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		_, err := c.PutSnapshot(ctx, name, e.Fence().Token, []byte(me+" again"), snapfence.PutOptions{})
		result := "accepted"
		if err != nil {
			result = snapfence.CodeOf(err)
		}
		say(map[string]any{"event": "write", "result": result})
	}
	return 0
}

func TestCandidatesLeadOneAtATimeInTheOrderTheyAsked(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	name := testenv.UniqueKey(t, "election")
	observer := election.New(c, name, election.Options{})
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	observed := observer.Observe(octx)
	if first := <-observed; first != (election.Leader{}) {
		t.Fatalf("a leader before any campaign: %+v", first)
	}
	if _, err := observer.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader with nobody leading: %v", err)
	}

	a := election.New(c, name, election.Options{TTL: 5 * time.Second})
	if err := a.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	b := election.New(c, name, election.Options{TTL: 5 * time.Second})
	bLeads := make(chan error, 1)
	go func() { bLeads <- b.Campaign(ctx, "b") }()
	testenv.Eventually(t, 30*time.Second, "b queues", func() bool {
		w, err := c.ListLeaseWaiters(ctx, name, snapfence.PageOptions{})
		return err == nil && len(w.Items) == 1
	})
	if l, err := observer.Leader(ctx); err != nil || l.Owner != "a" || l.Token != a.Token() {
		t.Fatalf("Leader: %+v %v", l, err)
	}
	if got := <-observed; got.Owner != "a" || got.Token != a.Token() {
		t.Fatalf("observed %+v", got)
	}
	if _, err := a.Proclaim(ctx, []byte("a's plan"), "text/plain"); err != nil {
		t.Fatal(err)
	}
	aToken := a.Token()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-bLeads; err != nil {
		t.Fatal(err)
	}
	if b.Token() <= aToken {
		t.Fatalf("b's token %d is not above a's %d", b.Token(), aToken)
	}
	for _, want := range []election.Leader{{}, {Owner: "b", Token: b.Token()}} {
		if got := <-observed; got != want {
			t.Fatalf("observed %+v, want %+v", got, want)
		}
	}
	// The deposed leader's token is refused; the new leader's fence is accepted.
	_, err := c.PutSnapshot(ctx, name, aToken, []byte("a again"), snapfence.PutOptions{})
	if !errors.Is(err, snapfence.ErrStaleToken) {
		t.Fatalf("a deposed leader's write: %v", err)
	}
	if _, err := a.Proclaim(ctx, []byte("a again"), "text/plain"); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("Proclaim after Resign: %v", err)
	}
	if _, err := b.Proclaim(ctx, []byte("b's plan"), "text/plain"); err != nil {
		t.Fatal(err)
	}
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-observed; got != (election.Leader{}) {
		t.Fatalf("observed %+v after the last resign", got)
	}
}

func TestCampaignEndsWithItsContext(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	name := testenv.UniqueKey(t, "election")
	a := election.New(c, name, election.Options{TTL: 5 * time.Second})
	if err := a.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	defer a.Resign(ctx)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := election.New(c, name, election.Options{}).Campaign(short, "b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a campaign past its deadline: %v", err)
	}
}

func TestTheLeadersFenceGuardsTheKeysUnderTheElection(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	name := testenv.UniqueKey(t, "election")
	a := election.New(c, name, election.Options{TTL: 5 * time.Second})
	if err := a.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	fence := a.Fence()
	w, err := c.PutSnapshot(ctx, name+"/plan", fence.Token, []byte("a's plan"), snapfence.PutOptions{FencingKey: fence.Key})
	if err != nil || w.FencingKey != name {
		_ = a.Resign(ctx)
		t.Skipf("the server has no namespace fences (contract v1.3) yet: %v", err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := election.New(c, name, election.Options{TTL: 5 * time.Second})
	if err := b.Campaign(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	defer b.Resign(ctx)
	_, err = c.PutSnapshot(ctx, name+"/plan", fence.Token, []byte("a again"), snapfence.PutOptions{FencingKey: fence.Key})
	if !errors.Is(err, snapfence.ErrStaleToken) {
		t.Fatalf("a deposed leader's fenced write: %v", err)
	}
	if _, err := c.PutSnapshot(ctx, name+"/plan", b.Fence().Token, []byte("b's plan"), snapfence.PutOptions{FencingKey: b.Fence().Key}); err != nil {
		t.Fatal(err)
	}
}
