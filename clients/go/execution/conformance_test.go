package execution_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/execution"
)

// The seed execution package's exported API (its documentation and published
// source), declaration by declaration; the declarations below fail to compile if this package
// drifts from it. TestTheExportedAPIIsTheSeedsAndMore checks the names.

// type Owner struct { ... } with these fields, types and JSON names.
type seedOwner struct {
	Token      string    `json:"token"`
	PID        int       `json:"pid"`
	Worktree   string    `json:"worktree"`
	Target     string    `json:"target,omitempty"`
	Mode       string    `json:"mode,omitempty"`
	Kind       string    `json:"kind,omitempty"`
	AcquiredAt time.Time `json:"acquiredAt"`
}

// type ConflictError struct { Worktree string; Owner *Owner; RecoveryRequired bool; Cause error }
// and nothing else: a conversion needs identical fields, so an unexported extra field (which
// would break a seed user's unkeyed literal) fails it.
type seedConflictError struct {
	Worktree         string
	Owner            *execution.Owner
	RecoveryRequired bool
	Cause            error
}

var (
	_ = execution.Owner(seedOwner{})
	_ = execution.ConflictError(seedConflictError{})
	_ = seedConflictError(execution.ConflictError{})

	// func (*ConflictError) Code() string; Error() string; Unwrap() error
	_ func(*execution.ConflictError) string = (*execution.ConflictError).Code
	_ func(*execution.ConflictError) string = (*execution.ConflictError).Error
	_ func(*execution.ConflictError) error  = (*execution.ConflictError).Unwrap
	_ error                                 = (*execution.ConflictError)(nil)

	// func Acquire(worktree string, owner Owner, opts ...Option) (*Lease, error)
	_ func(string, execution.Owner, ...execution.Option) (*execution.Lease, error) = execution.Acquire
	// func WithRecovery(reconcile func(Owner) error) Option
	_ func(func(execution.Owner) error) execution.Option = execution.WithRecovery
	// func ReadOwner(worktree string) (*Owner, error)
	_ func(string) (*execution.Owner, error) = execution.ReadOwner
	// func ContextWithLease(ctx context.Context, lease *Lease) context.Context
	_ func(context.Context, *execution.Lease) context.Context = execution.ContextWithLease
	// func FromContext(ctx context.Context) *Lease
	_ func(context.Context) *execution.Lease = execution.FromContext

	// func (l *Lease) Owner() Owner; ValidFor(worktree string) bool; Release() error;
	// RequireRecovery(); Abandon() error
	_ func(*execution.Lease) execution.Owner                      = (*execution.Lease).Owner
	_ func(*execution.Lease, string) bool                         = (*execution.Lease).ValidFor
	_ func(*execution.Lease) error                                = (*execution.Lease).Release
	_ func(*execution.Lease)                                      = (*execution.Lease).RequireRecovery
	_ func(*execution.Lease) error                                = (*execution.Lease).Abandon
	_ func(*execution.Lease) context.Context                      = (*execution.Lease).Context
	_ func(*execution.ConflictError) string                       = (*execution.ConflictError).ServiceCode
	_ func(string, ...execution.Option) (*execution.Owner, error) = execution.ReadOwnerWith
)

// A conversion ignores struct tags, so the JSON names are compared here.
func TestOwnerHasTheSeedsFieldsAndJSONNames(t *testing.T) {
	want, got := reflect.TypeOf(seedOwner{}), reflect.TypeOf(execution.Owner{})
	if want.NumField() != got.NumField() {
		t.Fatalf("Owner has %d fields, want %d", got.NumField(), want.NumField())
	}
	for i := 0; i < want.NumField(); i++ {
		w, g := want.Field(i), got.Field(i)
		if w.Name != g.Name || w.Type != g.Type || w.Tag != g.Tag {
			t.Fatalf("field %d is %s %s `%s`, want %s %s `%s`", i, g.Name, g.Type, g.Tag, w.Name, w.Type, w.Tag)
		}
	}
}

// The types' method sets hold the seed's methods (more are allowed), and Option's underlying
// type is a func of one pointer argument, as the seed's func(*options).
func TestTheExportedAPIIsTheSeedsAndMore(t *testing.T) {
	methods := map[reflect.Type][]string{
		reflect.TypeOf((*execution.Lease)(nil)):         {"Abandon", "Owner", "Release", "RequireRecovery", "ValidFor"},
		reflect.TypeOf((*execution.ConflictError)(nil)): {"Code", "Error", "Unwrap"},
	}
	for typ, names := range methods {
		for _, name := range names {
			if _, ok := typ.MethodByName(name); !ok {
				t.Errorf("%v has no method %s", typ, name)
			}
		}
	}
	opt := reflect.TypeOf(execution.Option(nil))
	if opt.Kind() != reflect.Func || opt.NumIn() != 1 || opt.In(0).Kind() != reflect.Pointer || opt.NumOut() != 0 {
		t.Errorf("Option is %v, want func(*options)", opt)
	}
	if reflect.TypeOf(execution.Lease{}).NumField() == 0 {
		t.Error("Lease has no fields")
	}
	for i := 0; i < reflect.TypeOf(execution.Lease{}).NumField(); i++ {
		if f := reflect.TypeOf(execution.Lease{}).Field(i); f.IsExported() {
			t.Errorf("Lease has the exported field %s; the seed's has none", f.Name)
		}
	}
	if code := (*execution.ConflictError)(nil).Code(); code != "resource_conflict" {
		t.Errorf("Code() = %q", code)
	}
}
