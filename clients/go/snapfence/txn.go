package snapfence

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// TxnOp is one operation of a transaction (contract v1.3); make them with TxnPut, TxnDelete
// and TxnDeletePrefix.
type TxnOp struct {
	Op          string          `json:"op"`
	Key         string          `json:"key,omitempty"`
	Prefix      string          `json:"prefix,omitempty"`
	Body        []byte          `json:"-"` // base64 on the wire, always sent for a put
	ContentType string          `json:"content_type,omitempty"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
	IfMatch     string          `json:"if_match,omitempty"`
	IfNoneMatch string          `json:"if_none_match,omitempty"`
}

// MarshalJSON writes the op as the contract does: a put's body in base64, even when empty.
func (o TxnOp) MarshalJSON() ([]byte, error) {
	type plain TxnOp
	out := struct {
		plain
		Body *[]byte `json:"body,omitempty"`
	}{plain: plain(o)}
	if o.Op == "put" {
		body := o.Body
		if body == nil {
			body = []byte{}
		}
		out.Body = &body
	}
	return json.Marshal(out)
}

// TxnPutOptions are the optional parts of a transaction's put.
type TxnPutOptions struct {
	// ContentType is stored with the body (application/octet-stream when "").
	ContentType string
	// Metadata is marshalled to a JSON object stored with the version; nil for none.
	Metadata any
	// IfMatch makes the transaction depend on the key's current ETag.
	IfMatch string
	// CreateOnly makes it depend on the key having no current snapshot (if_none_match "*").
	CreateOnly bool
}

// TxnPut writes body to key as part of a transaction.
func TxnPut(key string, body []byte, opts TxnPutOptions) (TxnOp, error) {
	op := TxnOp{Op: "put", Key: key, Body: body, ContentType: opts.ContentType, IfMatch: opts.IfMatch}
	if op.Body == nil {
		op.Body = []byte{}
	}
	if opts.CreateOnly {
		op.IfNoneMatch = "*"
	}
	if opts.Metadata != nil {
		raw, err := json.Marshal(opts.Metadata)
		if err != nil || len(raw) == 0 || raw[0] != '{' {
			return TxnOp{}, invalid("the metadata of the put of %q must marshal to a JSON object (%v)", key, err)
		}
		op.Metadata = raw
	}
	return op, nil
}

// TxnDelete deletes key's snapshot as part of a transaction (no error when it has none).
func TxnDelete(key string) TxnOp { return TxnOp{Op: "delete", Key: key} }

// TxnDeletePrefix deletes every snapshot under prefix as part of a transaction.
func TxnDeletePrefix(prefix string) TxnOp { return TxnOp{Op: "delete_prefix", Prefix: prefix} }

// TxnResult is one operation's outcome, in the order of the ops.
type TxnResult struct {
	// Key is the key of a put or delete; Prefix the prefix of a delete_prefix.
	Key    string `json:"key"`
	Prefix string `json:"prefix"`
	// A put's answer: as a PutSnapshot's.
	Token       uint64    `json:"token"`
	FencingKey  string    `json:"fencing_key"`
	Metadata    Metadata  `json:"metadata"`
	Version     uint64    `json:"version"`
	ETag        string    `json:"etag"`
	Size        int64     `json:"size"`
	ContentType string    `json:"content_type"`
	UpdatedAt   time.Time `json:"updated_at"`
	Created     bool      `json:"created"`
	// Deleted is a delete's outcome (true or false) or a delete_prefix's count.
	Deleted json.RawMessage `json:"deleted"`
}

// DeletedCount is a delete_prefix's count of deleted snapshots (1 or 0 for a delete).
func (r TxnResult) DeletedCount() int64 {
	var n int64
	if json.Unmarshal(r.Deleted, &n) == nil {
		return n
	}
	var b bool
	if json.Unmarshal(r.Deleted, &b) == nil && b {
		return 1
	}
	return 0
}

// TxnAnswer is a committed transaction.
type TxnAnswer struct {
	Token      uint64      `json:"token"`
	FencingKey string      `json:"fencing_key"`
	Results    []TxnResult `json:"results"`
	// Replayed is true when the answer is the stored one of an earlier attempt.
	Replayed bool `json:"-"`
}

// Txn commits ops as one (POST /v1/txn, contract v1.3), fenced by fence: every key must be in
// fence.Key's namespace, the fence rules hold for each, and every precondition must hold, or
// nothing is written. Refusals are *Error values: stale_token / unknown_token (FencingKey and
// Key name where it failed), precondition_failed (OpIndex), invalid_request.
func (c *Client) Txn(ctx context.Context, fence Fence, ops []TxnOp) (*TxnAnswer, error) {
	h, err := tokenHeader(fence.Token)
	if err != nil {
		return nil, err
	}
	if fence.Key == "" {
		return nil, invalid("a transaction needs its fence's key (the lease that fences its keys)")
	}
	fencingKeyHeader(h, fence.Key)
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json")
	data, err := json.Marshal(struct {
		Ops []TxnOp `json:"ops"`
	}{ops})
	if err != nil {
		return nil, invalid("the transaction cannot be marshalled to JSON: %v", err)
	}
	a, err := c.send(ctx, request{method: http.MethodPost, path: "/v1/txn", header: h, body: data, changing: true}, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var t TxnAnswer
	if err := decode(a, &t); err != nil {
		return nil, err
	}
	t.Replayed = replayed(a)
	return &t, nil
}
