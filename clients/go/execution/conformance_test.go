package execution_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/snapfence/snapfence/clients/go/execution"
)

// The execution package's contract, declared as its users know it (issue 16); the declarations
// below fail to compile if this package drifts from it.

type issueOwner struct {
	Token      string    `json:"token"`
	PID        int       `json:"pid"`
	Worktree   string    `json:"worktree"`
	Target     string    `json:"target,omitempty"`
	Mode       string    `json:"mode,omitempty"`
	Kind       string    `json:"kind,omitempty"`
	AcquiredAt time.Time `json:"acquiredAt"`
}

type issueConflictError interface {
	Code() string
	Error() string
	Unwrap() error
}

type issueLease interface {
	Abandon() error
	RequireRecovery()
	Release() error
}

var (
	_                    = execution.Owner(issueOwner{})
	_ issueConflictError = (*execution.ConflictError)(nil)
	_ error              = (*execution.ConflictError)(nil)
	// *ConflictError may carry the Owner.
	_            = func(e *execution.ConflictError) *execution.Owner { return e.Owner }
	_ issueLease = (*execution.Lease)(nil)
	// WithRecovery(reconcile) is an Option; reconcile's nil permits the replacement.
	_ func(func(context.Context, execution.Owner) error) execution.Option = execution.WithRecovery
	_ func(context.Context) (*execution.Lease, bool)                      = execution.FromContext
)

// A conversion ignores struct tags, so the JSON names are compared here.
func TestOwnerHasTheIssuesFieldsAndJSONNames(t *testing.T) {
	want, got := reflect.TypeOf(issueOwner{}), reflect.TypeOf(execution.Owner{})
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
