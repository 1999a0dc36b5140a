//go:build unix

package coordination_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

func TestAFrozenHolderLearnsOfTheLossAtItsNextCheckBeforeWriting(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "k")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+key, "SNAPFENCE_URL="+testenv.Shared.URL)
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
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := json.NewDecoder(stdout)
	var first struct{ Token uint64 }
	if err := lines.Decode(&first); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // past the TTL of 2 s
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	var result map[string]any
	if err := lines.Decode(&result); err != nil {
		t.Fatal(err)
	}
	if result["write"] != "not sent" || result["lease_lost"] != true || result["context_ended"] != true {
		t.Fatalf("after a pause past the TTL the check said %v", result)
	}
	s, err := c.GetSnapshot(ctx, key, snapfence.GetOptions{})
	if err != nil || string(s.Body) != "before the freeze" || s.Version != 1 || s.Token != first.Token {
		t.Fatalf("%+v %v", s, err)
	}
	rej, err := c.ListRejections(ctx, snapfence.AuditQuery{Key: key})
	if err != nil || len(rej.Items) != 0 {
		t.Fatalf("a write was sent: %+v %v", rej, err)
	}
}
