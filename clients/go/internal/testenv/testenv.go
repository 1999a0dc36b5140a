// Package testenv runs the module's tests against a real snapfence service: TestMain starts
// `snapfence serve` (from $SNAPFENCE_BIN, else the repository's target/debug/snapfence) with an
// embedded PostgreSQL in a temporary directory, or uses the server at $SNAPFENCE_URL; it also has
// the TCP proxy the tests cut and stall connections with.
package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ReadyTimeout bounds the wait for a started server's /readyz (it runs initdb first).
const ReadyTimeout = 60 * time.Second

// Server is a snapfence service the tests talk to.
type Server struct {
	// URL is its base URL.
	URL string
	// Dir is the temporary directory of a server the tests started ("" for $SNAPFENCE_URL).
	Dir string

	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
	stopped sync.Once
}

// Shared is the server of this test binary, set by Main.
var Shared *Server

// Owned reports whether the tests started the server (and so may signal it).
func (s *Server) Owned() bool { return s.cmd != nil }

// PID is the serve process's id (0 for $SNAPFENCE_URL).
func (s *Server) PID() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Freeze stops the serve process (SIGSTOP; an error where there are no such signals); Thaw
// resumes it.
func (s *Server) Freeze() error { return freeze(s.cmd.Process) }

// Thaw resumes a frozen serve process (SIGCONT).
func (s *Server) Thaw() error { return thaw(s.cmd.Process) }

// Log is the tail of the server's log.
func (s *Server) Log() string {
	if s.logPath == "" {
		return ""
	}
	data, _ := os.ReadFile(s.logPath)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// Stop ends a started server with SIGTERM (SIGKILL if it does not stop within 30 s) and removes
// its directory.
func (s *Server) Stop() {
	s.stopped.Do(func() {
		if s.cmd != nil {
			_ = thaw(s.cmd.Process)
			_ = terminate(s.cmd.Process)
			select {
			case <-s.exited:
			case <-time.After(30 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.exited
			}
		}
		if s.Dir != "" {
			_ = os.RemoveAll(s.Dir)
		}
	})
}

// moduleRoot is the directory of go.mod (clients/go), found from the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Binary is the snapfence binary: $SNAPFENCE_BIN, else ../../target/debug/snapfence from
// clients/go. The error says how to build it.
func Binary() (string, error) {
	if bin := os.Getenv("SNAPFENCE_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("SNAPFENCE_BIN=%s: %v", bin, err)
		}
		return bin, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Clean(filepath.Join(root, "..", "..", "target", "debug", "snapfence"))
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no snapfence binary at %s: run `cargo build --bin snapfence` at the repository root (or set SNAPFENCE_BIN, or SNAPFENCE_URL to use a running server)", bin)
	}
	return bin, nil
}

// StartOptions describe a server to start.
type StartOptions struct {
	// Args are added to `serve --data-dir D --listen A`.
	Args []string
	// Prepare runs before serve starts, with the binary and the data directory (e.g. to make
	// API keys with `snapfence keys create`).
	Prepare func(bin, dataDir string) error
	// Scheme is "http" (default) or "https".
	Scheme string
	// Env are "NAME=value" entries added to the server's environment (the test process's),
	// overriding the variables of the same name (e.g. the OTEL_* variables of traces).
	Env []string
}

// NewTempDir makes a directory (prefix sf-go-) that the postgres user can reach: as root the
// embedded PostgreSQL runs as postgres.
func NewTempDir() (string, error) {
	dir, err := os.MkdirTemp("", "sf-go-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// Start starts `snapfence serve` in a new temporary directory and waits for /readyz. dir, when
// not "", is used instead of a new one (and removed by Stop).
func Start(bin, dir string, opts StartOptions) (*Server, error) {
	if dir == "" {
		var err error
		if dir, err = NewTempDir(); err != nil {
			return nil, err
		}
	}
	dataDir := filepath.Join(dir, "data")
	if opts.Prepare != nil {
		if err := opts.Prepare(bin, dataDir); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	scheme := opts.Scheme
	if scheme == "" {
		scheme = "http"
	}
	var lastErr error
	// A free port can be taken between its probe and serve's bind: try a few.
	for try := 0; try < 3; try++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		s, err := startOn(bin, dir, dataDir, addr, scheme, opts.Args, opts.Env)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func startOn(bin, dir, dataDir, addr, scheme string, args, env []string) (*Server, error) {
	logPath := filepath.Join(dir, fmt.Sprintf("serve-%s.log", strings.ReplaceAll(addr, ":", "_")))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, append([]string{"serve", "--data-dir", dataDir, "--listen", addr}, args...)...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if len(env) > 0 {
		// The last of a name wins.
		cmd.Env = append(os.Environ(), env...)
	}
	// On Linux, if the test binary dies (a panic skips TestMain's cleanup), the server is told
	// to stop.
	stopWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{URL: scheme + "://" + addr, Dir: dir, cmd: cmd, exited: make(chan struct{}), logPath: logPath}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	if err := s.waitReady(scheme); err != nil {
		log := s.Log()
		s.stopKeepDir()
		return nil, fmt.Errorf("%v; server log:\n%s", err, log)
	}
	return s, nil
}

// stopKeepDir stops the process but keeps the directory (for another try).
func (s *Server) stopKeepDir() {
	_ = terminate(s.cmd.Process)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

func (s *Server) waitReady(scheme string) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	if scheme == "https" {
		// Readiness only: the tests check certificates themselves.
		hc.Transport = insecureTransport()
	}
	deadline := time.Now().Add(ReadyTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("snapfence serve exited before it was ready")
		default:
		}
		resp, err := hc.Get(s.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("snapfence serve at %s was not ready within %v", s.URL, ReadyTimeout)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Main is the TestMain of a package: it starts (or finds) the server, sets SNAPFENCE_URL for
// the examples, runs the tests and stops the server, also when they fail.
func Main(m *testing.M) int {
	if url := os.Getenv("SNAPFENCE_URL"); url != "" {
		Shared = &Server{URL: strings.TrimRight(url, "/")}
		return m.Run()
	}
	bin, err := Binary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	s, err := Start(bin, "", StartOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv: starting snapfence serve:", err)
		return 1
	}
	defer s.Stop()
	Shared = s
	if err := os.Setenv("SNAPFENCE_URL", s.URL); err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	defer os.Unsetenv("SNAPFENCE_URL")
	return m.Run()
}

// CreateKey makes an API key in the embedded cluster of dataDir and returns its token.
func CreateKey(bin, dataDir, name, scope, prefix string) (string, error) {
	cmd := exec.Command(bin, "--output", "json", "keys", "create", "--data-dir", dataDir, "--name", name, "--scope", scope, "--prefix", prefix)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("keys create %s: %v: %s", name, err, stderr.String())
	}
	var made struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(out, &made); err != nil || made.Token == "" {
		return "", fmt.Errorf("keys create %s: unreadable output %q", name, out)
	}
	return made.Token, nil
}

// Eventually polls cond every 50 ms until it is true or timeout passes (a generous ceiling, not
// an expectation).
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Context is a test's context, bounded by a generous ceiling.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// UniqueKey is a key no other test (or earlier run against $SNAPFENCE_URL) has used.
func UniqueKey(t testing.TB, name string) string {
	return fmt.Sprintf("go-tests/%s/%s-%d", strings.ReplaceAll(t.Name(), "/", "."), name, time.Now().UnixNano())
}

// ReadLines reads a child process's stdout lines into a channel.
func ReadLines(r *bufio.Reader) <-chan string {
	ch := make(chan string, 16)
	go func() {
		defer close(ch)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				ch <- strings.TrimRight(line, "\n")
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}
