package testenv

import (
	"bytes"
	"net"
	"net/url"
	"regexp"
	"sync"
	"testing"
)

// Proxy is a loopback TCP proxy in front of a server that the tests stall and cut: it plays the
// network between a client and the service.
type Proxy struct {
	// URL is the proxy's http:// base URL.
	URL string

	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	cuts    int // answers still to drop (connection closed at the answer's first byte)
	cutDone int
	sent    bytes.Buffer // everything clients sent
	conns   map[net.Conn]struct{}
	closed  bool
}

// NewProxy listens on a free loopback port and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{URL: "http://" + ln.Addr().String(), ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	return p, nil
}

// Stall holds every byte in both directions until Unstall (the service looks frozen to the
// clients behind the proxy).
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Unstall lets the held bytes through.
func (p *Proxy) Unstall() {
	p.mu.Lock()
	p.stalled = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// CutAnswers makes the proxy drop the next n answers: when an answer's first byte arrives from
// the server (so the server has handled the request), the connection is closed without passing
// it on.
func (p *Proxy) CutAnswers(n int) {
	p.mu.Lock()
	p.cuts = n
	p.mu.Unlock()
}

// Cut is how many answers were dropped.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cutDone
}

var idempotencyKeyHeader = regexp.MustCompile(`(?mi)^Idempotency-Key:[ \t]*([^\r\n]*?)[ \t]*\r?$`)

// IdempotencyKeys are the Idempotency-Key headers of every request sent through the proxy, in
// order.
func (p *Proxy) IdempotencyKeys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var keys []string
	for _, m := range idempotencyKeyHeader.FindAllSubmatch(p.sent.Bytes(), -1) {
		keys = append(keys, string(m[1]))
	}
	return keys
}

// CutConnections closes every open connection, both sides (a network failure mid-stream); the
// proxy goes on accepting new ones. It returns how many connections it closed.
func (p *Proxy) CutConnections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2
	for c := range p.conns {
		_ = c.Close()
	}
	return n
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.stalled = false
	p.cond.Broadcast()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns[client] = struct{}{}
		p.conns[server] = struct{}{}
		p.mu.Unlock()
		closeBoth := func() {
			_ = client.Close()
			_ = server.Close()
			p.mu.Lock()
			delete(p.conns, client)
			delete(p.conns, server)
			p.mu.Unlock()
		}
		go p.pipe(client, server, true, closeBoth)
		go p.pipe(server, client, false, closeBoth)
	}
}

// pipe copies from src to dst, honouring stalls, recording what clients send, and dropping
// answers to cut.
func (p *Proxy) pipe(src, dst net.Conn, fromClient bool, closeBoth func()) {
	defer closeBoth()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled && !p.closed {
				p.cond.Wait()
			}
			if fromClient {
				p.sent.Write(buf[:n])
			} else if p.cuts > 0 {
				p.cuts--
				p.cutDone++
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: closeBoth ends the other direction too
		}
	}
}

// ProxyFor is a Proxy in front of the server at serverURL, closed when the test ends.
func ProxyFor(t testing.TB, serverURL string) *Proxy {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
