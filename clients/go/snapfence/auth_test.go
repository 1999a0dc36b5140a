package snapfence_test

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/internal/testenv"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// TestAPIKeysAndAPrivateCA runs a second service of its own, with HTTPS from a throwaway CA and
// API keys, so it needs the snapfence binary even when SNAPFENCE_URL is set.
func TestAPIKeysAndAPrivateCA(t *testing.T) {
	bin, err := testenv.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := testenv.NewTempDir()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := testenv.NewPrivateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	srv, err := testenv.Start(bin, dir, testenv.StartOptions{
		Scheme: "https",
		Args:   []string{"--tls-cert", ca.CertFile, "--tls-key", ca.KeyFile},
		Prepare: func(bin, dataDir string) error {
			for _, k := range []struct{ name, scope, prefix string }{
				{"ops", "admin", ""}, {"worker", "write", "jobs/"}, {"viewer", "read", ""},
			} {
				token, err := testenv.CreateKey(bin, dataDir, k.name, k.scope, k.prefix)
				if err != nil {
					return err
				}
				tokens[k.name] = token
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	ctx := testenv.Context(t)
	with := func(opts ...snapfence.Option) *snapfence.Client {
		t.Helper()
		c, err := snapfence.New(srv.URL, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// The system roots do not know the private CA: a TLS failure, not retried.
	_, err = with(snapfence.WithAPIKey(tokens["ops"])).GetLease(ctx, "jobs/1")
	var te *snapfence.TransportError
	var unknownAuthority x509.UnknownAuthorityError
	if !errors.As(err, &te) || te.Sent || te.Attempts != 1 || !errors.As(err, &unknownAuthority) {
		t.Fatalf("an unknown CA: %#v", err)
	}

	trust := snapfence.WithCACertFile(ca.CAFile)
	worker := with(trust, snapfence.WithAPIKey(tokens["worker"]))
	g, err := worker.Acquire(ctx, "jobs/1", snapfence.AcquireRequest{Owner: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := worker.PutSnapshot(ctx, "jobs/1", g.Token, []byte("x"), snapfence.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// Outside its prefix, and the audit log: forbidden.
	_, err = worker.Acquire(ctx, "other/1", snapfence.AcquireRequest{Owner: "w", TTL: time.Minute})
	if e := wantCode(t, err, snapfence.CodeForbidden); e.Status != 403 {
		t.Fatalf("status %d", e.Status)
	}
	_, err = worker.ListRejections(ctx, snapfence.AuditQuery{Key: "jobs/1"})
	wantCode(t, err, snapfence.CodeForbidden)

	viewer := with(snapfence.WithCACertPEM(ca.CAPEM), snapfence.WithAPIKey(tokens["viewer"]))
	if s, err := viewer.GetSnapshot(ctx, "jobs/1", snapfence.GetOptions{}); err != nil || string(s.Body) != "x" {
		t.Fatalf("a read key reads: %+v %v", s, err)
	}
	wantCode(t, viewer.Release(ctx, "jobs/1", g.Token), snapfence.CodeForbidden)

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CAPEM)
	ops := with(snapfence.WithRootCAs(pool), snapfence.WithAPIKey(tokens["ops"]))
	if _, err := ops.ListRejections(ctx, snapfence.AuditQuery{}); err != nil {
		t.Fatalf("an admin key reads the audit log: %v", err)
	}

	for name, c := range map[string]*snapfence.Client{
		"no key":    with(trust),
		"wrong key": with(trust, snapfence.WithAPIKey("sf_1_notthesecret")),
	} {
		_, err := c.GetLease(ctx, "jobs/1")
		if e := wantCode(t, err, snapfence.CodeUnauthorized); e.Status != 401 || e.Attempts != 1 {
			t.Fatalf("%s: %+v", name, e)
		}
		_, err = c.HeadSnapshot(ctx, "jobs/1", snapfence.GetOptions{})
		wantCode(t, err, snapfence.CodeUnauthorized)
	}

	// NewFromEnv reads the CLI's variables.
	t.Setenv("SNAPFENCE_URL", srv.URL)
	t.Setenv("SNAPFENCE_API_KEY", tokens["worker"])
	t.Setenv("SNAPFENCE_CA_CERT", ca.CAFile)
	env, err := snapfence.NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Release(ctx, "jobs/1", g.Token); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SNAPFENCE_CA_CERT", filepath.Join(dir, "missing.pem"))
	if _, err := snapfence.NewFromEnv(); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing SNAPFENCE_CA_CERT: %v", err)
	}
}
