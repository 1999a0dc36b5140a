// Package election is leader election on a snapfence key, in the shape of etcd's
// concurrency.Election: Campaign waits in the key's queue (candidates lead in the order they
// asked), Resign hands leadership to the next candidate at once, Leader reads who leads, and
// Observe follows every change through the watch. Unlike etcd's, the leader's fencing token is
// checked by the store: Fence is what the leader sends with its writes (the election key and
// everything under name/ with contract v1.3), and a deposed leader's writes are refused.
//
// Leadership is a lease kept by a coordination.Keeper: the grant that ends the wait is renewed
// at once and its deadline dated from that renewal, so a long wait never reads as a lapsing
// lease and a failover grants one token, which is kept. A leader that dies is replaced within
// its TTL plus the hand-off (the service grants the key to the first waiter as soon as the
// database clock passes the expiry).
package election

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/snapfence/snapfence/clients/go/coordination"
	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// maxWait is the longest one waiting acquire waits (the contract's bound); Campaign asks again
// after it.
const maxWait = 300 * time.Second

// ErrNoLeader is Leader's answer when nobody leads.
var ErrNoLeader = errors.New("election: no leader")

// ErrNotLeader is the answer of the calls that need leadership (Proclaim) from a candidate
// that does not lead.
var ErrNotLeader = errors.New("election: not the leader")

// Options tune an Election. The zero value leads with 15 s leases.
type Options struct {
	// TTL is the leader's lease TTL: how long a dead leader keeps the lead at most. 0 for 15 s.
	TTL time.Duration
	// Margin and RenewEvery are the keeper's (coordination.KeeperOptions): 0 for a fifth and a
	// third of the TTL.
	Margin, RenewEvery time.Duration
}

// Leader is who leads: the candidate's name and its lease's fencing token.
type Leader struct {
	Owner string
	Token uint64
}

// Election is one candidate's view of the election named by a key (use one no lease or snapshot
// of yours uses otherwise). Safe for concurrent use.
type Election struct {
	client *snapfence.Client
	locker *coordination.ServiceLocker
	name   string
	opts   Options

	mu     sync.Mutex
	keeper *coordination.Keeper
}

// New is the election named name on the service of client.
func New(client *snapfence.Client, name string, opts Options) *Election {
	if opts.TTL == 0 {
		opts.TTL = 15 * time.Second
	}
	return &Election{client: client, locker: coordination.NewLocker(client), name: name, opts: opts}
}

// Key is the election's key.
func (e *Election) Key() string { return e.name }

// Campaign waits in the queue until candidate leads, or ctx ends (its error then). ctx bounds
// only the campaign: leadership lasts until Resign, or until it is lost (Done, Err).
func (e *Election) Campaign(ctx context.Context, candidate string) error {
	e.mu.Lock()
	leading := e.keeper != nil && e.keeper.Err() == nil
	e.mu.Unlock()
	if leading {
		return fmt.Errorf("election %q: this candidate leads already; Resign first", e.name)
	}
	kopts := coordination.KeeperOptions{Margin: e.opts.Margin, RenewEvery: e.opts.RenewEvery}
	for {
		wait := maxWait
		if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
			wait = time.Until(d)
		}
		if wait < time.Millisecond {
			return context.DeadlineExceeded
		}
		lease, ok, err := e.locker.AcquireWait(ctx, e.name, candidate, e.opts.TTL, wait)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if !ok {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		// Keep renews the grant at once and dates the deadline from that renewal: the wait in
		// the queue is not counted against the lease. Its context is not ctx: leadership
		// outlives the campaign.
		k, err := coordination.Keep(context.Background(), e.locker, lease, e.opts.TTL, kopts)
		if err != nil {
			var lost *coordination.LostError
			if errors.As(err, &lost) && ctx.Err() == nil {
				continue // the grant ended before it could be kept: queue again
			}
			return err
		}
		e.mu.Lock()
		e.keeper = k
		e.mu.Unlock()
		return nil
	}
}

func (e *Election) leadership() *coordination.Keeper {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.keeper
}

// Resign gives leadership up: the next candidate in the queue leads at once. A no-op when this
// candidate does not lead; a *coordination.LostError when its lease had ended already.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	k := e.keeper
	e.keeper = nil
	e.mu.Unlock()
	if k == nil {
		return nil
	}
	return k.Release(ctx)
}

// Token is the leader's fencing token, 0 when this candidate does not lead.
func (e *Election) Token() uint64 {
	if k := e.leadership(); k != nil {
		return k.Lease().Token
	}
	return 0
}

// Fence is what the leader sends with its writes: the election key and its token. With
// contract v1.3 it fences every key under Key()+"/" too (PutOptions.FencingKey = Fence().Key).
func (e *Election) Fence() snapfence.Fence {
	return snapfence.Fence{Key: e.name, Token: e.Token()}
}

// Context is cancelled when leadership ends: lost (coordination.Cause says why) or resigned.
// context.Background's Done (never) when this candidate does not lead.
func (e *Election) Context() context.Context {
	if k := e.leadership(); k != nil {
		return k.Context()
	}
	return context.Background()
}

// Done is Context().Done().
func (e *Election) Done() <-chan struct{} { return e.Context().Done() }

// Err is the loss of leadership (a *coordination.LostError matching snapfence.ErrLeaseLost),
// ErrNotLeader when this candidate does not lead, or nil while it leads. It reads the clock: a
// leader paused past its TTL learns at its next check, before its next write.
func (e *Election) Err() error {
	k := e.leadership()
	if k == nil {
		return ErrNotLeader
	}
	return k.Err()
}

// Proclaim writes value as the election key's snapshot, fenced by the leader's token: what
// etcd's Proclaim does with the leader's value. Refused (stale_token) once another leads.
func (e *Election) Proclaim(ctx context.Context, value []byte, contentType string) (*snapfence.Written, error) {
	token := e.Token()
	if token == 0 {
		return nil, ErrNotLeader
	}
	return e.client.PutSnapshot(ctx, e.name, token, value, snapfence.PutOptions{ContentType: contentType})
}

// Leader is who leads now; ErrNoLeader when nobody does.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	status, err := e.client.GetLease(ctx, e.name)
	if errors.Is(err, snapfence.ErrNotFound) {
		return Leader{}, ErrNoLeader
	}
	if err != nil {
		return Leader{}, err
	}
	if l, ok := leaderOf(status); ok {
		return l, nil
	}
	return Leader{}, ErrNoLeader
}

func leaderOf(s *snapfence.KeyStatus) (Leader, bool) {
	if s == nil || s.State != snapfence.StateHeld {
		return Leader{}, false
	}
	return Leader{Owner: s.Lease.Owner, Token: s.Lease.Token}, true
}

// Observe sends the current leader (the zero Leader for none), then every change of leader as
// it happens, read from the watch, until ctx ends (the channel is then closed). A watch that
// fails for good closes it too.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader)
	go func() {
		defer close(ch)
		w, err := e.client.Watch(ctx, snapfence.WatchOptions{Prefix: e.name})
		if err != nil {
			return
		}
		defer w.Close()
		var current Leader
		var newest uint64
		status, err := e.client.GetLease(ctx, e.name)
		if err != nil && !errors.Is(err, snapfence.ErrNotFound) {
			return
		}
		if status != nil {
			newest = status.NewestToken
			current, _ = leaderOf(status)
		}
		send := func(l Leader) bool {
			select {
			case ch <- l:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if !send(current) {
			return
		}
		for {
			ev, err := w.Next(ctx)
			if err != nil {
				return
			}
			if ev.Key != e.name {
				continue
			}
			switch ev.Kind {
			case snapfence.EventLeaseGranted:
				if ev.Token <= newest {
					continue // the status read saw it already
				}
				newest = ev.Token
				current = Leader{Owner: ev.Owner, Token: ev.Token}
			case snapfence.EventLeaseReleased, snapfence.EventLeaseExpired, snapfence.EventLeaseAbandoned:
				if current.Token == 0 || ev.Token != current.Token {
					continue
				}
				current = Leader{}
			default:
				continue
			}
			if !send(current) {
				return
			}
		}
	}()
	return ch
}
