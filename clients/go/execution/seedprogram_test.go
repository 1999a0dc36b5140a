package execution_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// The seed packages this module stands in for, by their import paths here.
var seedPackages = []string{"execution", "coordination"}

const modulePath = "github.com/snapfence/snapfence/clients/go"

// goTool is the go command that builds the test's programs.
func goTool(t *testing.T) string {
	t.Helper()
	if bin := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(bin) {
		return bin
	}
	bin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command to build the seed program with: %v", err)
	}
	return bin
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// goBuild runs `go build -o out pkg` in dir, offline.
func goBuild(t *testing.T, dir, out, pkg, what string) {
	t.Helper()
	cmd := exec.Command(goTool(t), "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "CGO_ENABLED=0")
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the seed program %s: %v\n%s", what, err, output)
	}
}

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// buildSeedProgram compiles testdata/seedprogram twice: against the seed's declarations
// (testdata/seedapi, in a module of its own, with nothing changed in the program but its import
// paths), which shows that it uses the seed's API alone, and against this module, to be run.
func buildSeedProgram(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "seedprogram", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	source := string(data)
	dir := t.TempDir()
	seed := filepath.Join(dir, "seed")
	files := map[string]string{"go.mod": "module seedcheck\n\ngo 1.19\n"}
	for _, pkg := range seedPackages {
		ours := `"` + modulePath + "/" + pkg + `"`
		if strings.Count(source, ours) != 1 {
			t.Fatalf("testdata/seedprogram must import %s once", ours)
		}
		source = strings.Replace(source, ours, `"seedcheck/`+pkg+`"`, 1)
		stub, err := os.ReadFile(filepath.Join("testdata", "seedapi", pkg, pkg+".go"))
		if err != nil {
			t.Fatal(err)
		}
		files[pkg+"/"+pkg+".go"] = string(stub)
	}
	if strings.Contains(source, modulePath) {
		t.Fatalf("testdata/seedprogram imports a package of %s that the seed does not have", modulePath)
	}
	files["seedprogram/main.go"] = source
	writeFiles(t, seed, files)
	goBuild(t, seed, filepath.Join(dir, "against-the-seed"), "./seedprogram", "against the seed's declarations")
	program := filepath.Join(dir, "seedprogram")
	if runtime.GOOS == "windows" {
		program += ".exe"
	}
	goBuild(t, ".", program, "./testdata/seedprogram", "against this module")
	return program
}

// hasReconciledRoute reports whether the service has contract v1.2's
// POST /v1/leases/{key}/reconciled: a server without it answers 404 for a key that is leased.
func hasReconciledRoute(t *testing.T) bool {
	t.Helper()
	c := newClient(t)
	ctx := testenv.Context(t)
	key := testenv.UniqueKey(t, "probe")
	g, err := c.Acquire(ctx, key, snapfence.AcquireRequest{Owner: "probe", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ctx, key, g.Token)
	_, err = c.Reconciled(ctx, key, g.Token)
	var apiErr *snapfence.Error
	if errors.As(err, &apiErr) && apiErr.Status == 404 {
		return false
	}
	return true
}

// A program written against the seed's API alone, compiled unchanged but for its import path,
// behaves as the seed's documentation says against a real service.
func TestASeedProgramRunsUnchanged(t *testing.T) {
	program := buildSeedProgram(t)
	v12 := hasReconciledRoute(t)
	for _, scenario := range []struct {
		name       string
		v12        bool
		reconciles bool
	}{
		{name: "nil-lease"},
		{name: "symlinked-competitor"},
		{name: "abandon-keeps-the-record"},
		{name: "require-recovery-release"},
		{name: "failing-reconcile", v12: true},
		{name: "refused-during-reconcile", v12: true},
		{name: "reconcile-replaces-a-record", v12: true},
		{name: "coordination-lease"},
	} {
		scenario := scenario
		t.Run(scenario.name, func(t *testing.T) {
			if scenario.v12 && !v12 {
				t.Skip("the service answers 404 for POST /v1/leases/{key}/reconciled: it has no contract v1.2, which WithRecovery needs")
			}
			cmd := exec.Command(program, t.TempDir(), scenario.name)
			output, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(output)) != "ok" {
				t.Fatalf("%v: %s", err, output)
			}
		})
	}
}
