package testenv

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// SpanKindServer is Span.Kind of a server span (OTLP's SPAN_KIND_SERVER).
const SpanKindServer = 2

// Span is one span an OTLPReceiver received, ids in lowercase hex as OTLP/JSON sends them.
type Span struct {
	TraceID      string
	SpanID       string
	ParentSpanID string // "" for a root span
	Name         string
	Kind         int
	// Attributes are the span's string and integer attributes, as text.
	Attributes map[string]string
}

func (s Span) String() string {
	return fmt.Sprintf("%q trace %s span %s parent %q kind %d", s.Name, s.TraceID, s.SpanID, s.ParentSpanID, s.Kind)
}

// OTLPReceiver is a collector of traces over OTLP/HTTP with JSON bodies (POST /v1/traces), on a
// loopback port: start a server with its Env to see the spans it exports.
type OTLPReceiver struct {
	// URL is the receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
	URL string

	srv *http.Server

	mu      sync.Mutex
	spans   []Span
	refused []string // why requests were refused: a test that waits in vain says it
}

// NewOTLPReceiver listens on a free loopback port.
func NewOTLPReceiver() (*OTLPReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &OTLPReceiver{URL: "http://" + ln.Addr().String()}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.export), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// Env is the environment that makes `snapfence serve` export its traces to r as OTLP/JSON,
// in batches sent every 100 ms.
func (r *OTLPReceiver) Env() []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.URL,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/json",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
}

// Close stops listening.
func (r *OTLPReceiver) Close() { _ = r.srv.Close() }

// Spans is every span received so far.
func (r *OTLPReceiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitFor polls the received spans (every 50 ms, up to timeout) until match finds one, and
// returns it; the test fails, listing what was received, when none comes.
func (r *OTLPReceiver) WaitFor(t testing.TB, timeout time.Duration, what string, match func(Span) bool) Span {
	t.Helper()
	return r.WaitForN(t, timeout, what, 1, match)[0]
}

// WaitForN polls the received spans (every 50 ms, up to timeout) until match finds n of them,
// and returns those it found (n or more); the test fails, listing what was received, when fewer
// come.
func (r *OTLPReceiver) WaitForN(t testing.TB, timeout time.Duration, what string, n int, match func(Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var found []Span
	for {
		found = found[:0]
		for _, s := range r.Spans() {
			if match(s) {
				found = append(found, s)
			}
		}
		if len(found) >= n {
			return found
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var got []string
	for _, s := range r.Spans() {
		got = append(got, "  "+s.String())
	}
	r.mu.Lock()
	refused := strings.Join(r.refused, "; ")
	r.mu.Unlock()
	t.Fatalf("%d span(s) %s within %v, not %d; received:\n%s\nrefused exports: %q", len(found), what, timeout, n, strings.Join(got, "\n"), refused)
	return nil
}

// The OTLP/JSON of an ExportTraceServiceRequest, as far as the tests read it.
type otlpRequest struct {
	ResourceSpans []struct {
		ScopeSpans []struct {
			Spans []struct {
				TraceID      string          `json:"traceId"`
				SpanID       string          `json:"spanId"`
				ParentSpanID string          `json:"parentSpanId"`
				Name         string          `json:"name"`
				Kind         json.RawMessage `json:"kind"`
				Attributes   []struct {
					Key   string `json:"key"`
					Value struct {
						StringValue *string         `json:"stringValue"`
						IntValue    json.RawMessage `json:"intValue"`
					} `json:"value"`
				} `json:"attributes"`
			} `json:"spans"`
		} `json:"scopeSpans"`
	} `json:"resourceSpans"`
}

var spanKinds = map[string]int{
	"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2,
	"SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5,
}

func (r *OTLPReceiver) refuse(w http.ResponseWriter, status int, why string) {
	r.mu.Lock()
	r.refused = append(r.refused, why)
	r.mu.Unlock()
	http.Error(w, why, status)
}

func (r *OTLPReceiver) export(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		r.refuse(w, http.StatusNotFound, fmt.Sprintf("%s %s", req.Method, req.URL.Path))
		return
	}
	if ct := req.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		r.refuse(w, http.StatusUnsupportedMediaType, "content type "+ct+", not OTLP/JSON")
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			r.refuse(w, http.StatusBadRequest, err.Error())
			return
		}
		body = gz
	}
	var export otlpRequest
	if err := json.NewDecoder(body).Decode(&export); err != nil {
		r.refuse(w, http.StatusBadRequest, "unreadable OTLP/JSON: "+err.Error())
		return
	}
	var got []Span
	for _, rs := range export.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				span := Span{
					TraceID:      strings.ToLower(s.TraceID),
					SpanID:       strings.ToLower(s.SpanID),
					ParentSpanID: strings.ToLower(s.ParentSpanID),
					Name:         s.Name,
					Attributes:   map[string]string{},
				}
				var name string
				if json.Unmarshal(s.Kind, &span.Kind) != nil && json.Unmarshal(s.Kind, &name) == nil {
					span.Kind = spanKinds[name]
				}
				for _, a := range s.Attributes {
					switch {
					case a.Value.StringValue != nil:
						span.Attributes[a.Key] = *a.Value.StringValue
					case len(a.Value.IntValue) > 0:
						span.Attributes[a.Key] = strings.Trim(string(a.Value.IntValue), `"`)
					}
				}
				got = append(got, span)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, "{}")
}

// StartTraced starts a server of the test's own (so it needs the binary even when SNAPFENCE_URL
// is set) that exports its traces to a new OTLPReceiver; both stop when the test ends.
func StartTraced(t testing.TB) (*Server, *OTLPReceiver) {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewOTLPReceiver()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	s, err := Start(bin, "", StartOptions{Env: r.Env()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s, r
}
