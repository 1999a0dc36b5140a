package snapfence_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/snapfence/snapfence/clients/go/snapfence"
)

// The ops of a transaction marshal to the contract's JSON (checked without sending: the server
// of these tests may predate v1.3).
func TestTxnOpsAreTheContractsJSON(t *testing.T) {
	put, err := snapfence.TxnPut("threads/42/c/7", []byte{0, 1}, snapfence.TxnPutOptions{
		ContentType: "application/json", Metadata: map[string]int{"step": 7}, IfMatch: `"e"`,
	})
	if err != nil {
		t.Fatal(err)
	}
	create, err := snapfence.TxnPut("threads/42/w/7/a", []byte("a"), snapfence.TxnPutOptions{CreateOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal([]snapfence.TxnOp{put, create, snapfence.TxnDelete("threads/42/w/6/a"), snapfence.TxnDeletePrefix("threads/42/w/6/")})
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"op":"put","key":"threads/42/c/7","body":"AAE=","content_type":"application/json","metadata":{"step":7},"if_match":"\"e\""},` +
		`{"op":"put","key":"threads/42/w/7/a","body":"YQ==","if_none_match":"*"},` +
		`{"op":"delete","key":"threads/42/w/6/a"},{"op":"delete_prefix","prefix":"threads/42/w/6/"}]`
	var got, exp any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal([]byte(want), &exp)
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("got  %s\nwant %s", raw, want)
	}
	empty, _ := snapfence.TxnPut("k", nil, snapfence.TxnPutOptions{})
	if raw, _ := json.Marshal(empty); string(raw) != `{"op":"put","key":"k","body":""}` { // fields in declaration order
		t.Fatalf("an empty put: %s", raw)
	}
	if _, err := snapfence.TxnPut("k", nil, snapfence.TxnPutOptions{Metadata: []int{1}}); snapfence.CodeOf(err) != snapfence.CodeInvalidRequest {
		t.Fatalf("metadata that is not an object: %v", err)
	}
}
