//go:build unix

package election_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

type line struct {
	who string
	ev  map[string]any
	at  time.Time
}

type candidate struct {
	me    string
	cmd   *exec.Cmd
	stdin interface{ Write([]byte) (int, error) }
}

func startCandidate(t *testing.T, name, me string, lines chan<- line) *candidate {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), candidateEnv+"="+name, candidateEnv+"_ME="+me, "SNAPFENCE_URL="+testenv.Shared.URL)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		dec := json.NewDecoder(stdout)
		for {
			var ev map[string]any
			if dec.Decode(&ev) != nil {
				return
			}
			lines <- line{who: me, ev: ev, at: time.Now()}
		}
	}()
	return &candidate{me: me, cmd: cmd, stdin: stdin}
}

// next is the next line of event want; a "lost" line before it fails the test.
func next(t *testing.T, lines <-chan line, want string, timeout time.Duration) line {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-lines:
			if l.ev["event"] == want {
				return l
			}
			if l.ev["event"] == "lost" {
				t.Fatalf("%s lost its leadership: %v", l.who, l.ev)
			}
		case <-deadline:
			t.Fatalf("no %q from any candidate within %v", want, timeout)
		}
	}
}

func token(l line) uint64 { return uint64(l.ev["token"].(float64)) }

func TestAKilledLeaderIsReplacedOnceAndAPausedOneIsFenced(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	name := testenv.UniqueKey(t, "election")
	w, err := c.Watch(ctx, snapfence.WatchOptions{Prefix: name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	lines := make(chan line, 64)
	cands := map[string]*candidate{}

	cands["a"] = startCandidate(t, name, "a", lines)
	l := next(t, lines, "leader", time.Minute)
	if l.who != "a" {
		t.Fatalf("%s leads first", l.who)
	}
	firstToken := token(l)
	next(t, lines, "wrote", time.Minute)
	for _, me := range []string{"b", "c"} {
		cands[me] = startCandidate(t, name, me, lines)
		next(t, lines, "campaigning", time.Minute)
	}
	testenv.Eventually(t, 30*time.Second, "the standbys queue", func() bool {
		ws, err := c.ListLeaseWaiters(ctx, name, snapfence.PageOptions{})
		return err == nil && len(ws.Items) == 2
	})

	// The leader dies: exactly one standby takes over.
	killed := time.Now()
	if err := cands["a"].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	elected := next(t, lines, "leader", 5*candidateTTL)
	newLeader, newToken := elected.who, token(elected)
	wrote := next(t, lines, "wrote", 5*candidateTTL)
	failover := wrote.at.Sub(killed)
	t.Logf("failover after SIGKILL: elected in %.2f s, first write in %.2f s", elected.at.Sub(killed).Seconds(), failover.Seconds())
	if newToken <= firstToken || failover > candidateTTL+2*time.Second {
		t.Fatalf("new leader %s token %d (first %d) after %v", newLeader, newToken, firstToken, failover)
	}
	s, err := c.GetSnapshot(ctx, name, snapfence.GetOptions{})
	if err != nil || string(s.Body) != newLeader {
		t.Fatalf("%+v %v", s, err)
	}

	// Over the hand-off and two more TTLs: nobody else is elected, nobody loses.
	time.Sleep(2 * candidateTTL)
	select {
	case l := <-lines:
		t.Fatalf("after the failover: %s %v", l.who, l.ev)
	default:
	}
	status, err := c.GetLease(ctx, name)
	if err != nil || status.State != snapfence.StateHeld || status.Lease.Token != newToken {
		t.Fatalf("%+v %v", status, err)
	}
	var granted []uint64
	for {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		ev, err := w.Next(wctx)
		cancel()
		if err != nil {
			break
		}
		switch {
		case ev.Kind == snapfence.EventLeaseGranted:
			granted = append(granted, ev.Token)
		case ev.Kind != snapfence.EventSnapshotWritten && ev.Token != firstToken:
			t.Fatalf("a token was dropped: %s %d", ev.Kind, ev.Token)
		}
	}
	if fmt.Sprint(granted) != fmt.Sprint([]uint64{firstToken, newToken}) {
		t.Fatalf("tokens granted: %v, want [%d %d]", granted, firstToken, newToken)
	}

	// The new leader is paused past its TTL: the last standby takes over, and the paused
	// leader's write after it resumes is refused by the fence.
	third := "b"
	if newLeader == "b" {
		third = "c"
	}
	paused := cands[newLeader]
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	l = next(t, lines, "leader", 5*candidateTTL)
	if l.who != third || token(l) <= newToken {
		t.Fatalf("%s leads with %d", l.who, token(l))
	}
	thirdToken := token(l)
	next(t, lines, "wrote", 5*candidateTTL)
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := paused.stdin.Write([]byte("write\n")); err != nil {
		t.Fatal(err)
	}
	sawLost := false
	var result any
	for result == nil {
		select {
		case l := <-lines:
			if l.who != newLeader {
				t.Fatalf("%s: %v", l.who, l.ev)
			}
			switch l.ev["event"] {
			case "lost":
				sawLost = true
			case "write":
				result = l.ev["result"]
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the paused leader did not write")
		}
	}
	if result != snapfence.CodeStaleToken {
		t.Fatalf("the paused leader's write: %v", result)
	}
	if !sawLost {
		select {
		case l := <-lines:
			if l.who != newLeader || l.ev["event"] != "lost" {
				t.Fatalf("%s: %v", l.who, l.ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the paused leader's keeper did not say it lost")
		}
	}
	s, err = c.GetSnapshot(ctx, name, snapfence.GetOptions{})
	if err != nil || string(s.Body) != third || s.Token != thirdToken {
		t.Fatalf("%+v %v", s, err)
	}
	rej, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: name})
	if err != nil || len(rej.Items) != 1 || rej.Items[0].PresentedToken != newToken || rej.Items[0].HighestToken != thirdToken {
		t.Fatalf("%+v %v", rej, err)
	}
}
