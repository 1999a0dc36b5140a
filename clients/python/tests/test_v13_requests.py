"""The v1.3 requests as the contract writes them, checked without sending (the server of these
tests may predate v1.3): the fence's key percent-encoded as a path segment, metadata as ASCII
JSON, a transaction's ops with base64 bodies."""

from __future__ import annotations

import base64
import json

import pytest

import snapfence
from snapfence import TxnOp, _core


def test_a_fenced_put_names_its_fence_and_carries_ascii_metadata() -> None:
    call = _core.put_snapshot("threads/42/c/1", 7, b"x", fencing_key="threads/42", metadata={"step": "é"})
    assert call.headers["Fencing-Key"] == "threads%2F42"
    assert call.headers["Fencing-Token"] == "7"
    assert call.headers["Snapshot-Metadata"] == '{"step":"\\u00e9"}'
    assert json.loads(call.headers["Snapshot-Metadata"]) == {"step": "é"}


def test_a_transaction_is_the_contracts_json() -> None:
    call = _core.txn(
        "threads/42",
        9,
        [
            TxnOp.put("threads/42/c/7", b"\x00\x01", content_type="application/json", metadata={"step": 7}, if_match='"e"'),
            TxnOp.put("threads/42/w/7/a", b"a", create_only=True),
            TxnOp.delete("threads/42/w/6/a"),
            TxnOp.delete_prefix("threads/42/w/6/"),
        ],
    )
    assert (call.method, call.path) == ("POST", "/v1/txn")
    assert call.headers["Fencing-Key"] == "threads%2F42" and call.headers["Fencing-Token"] == "9"
    assert call.content is not None
    assert json.loads(call.content) == {
        "ops": [
            {
                "op": "put",
                "key": "threads/42/c/7",
                "body": base64.b64encode(b"\x00\x01").decode(),
                "content_type": "application/json",
                "metadata": {"step": 7},
                "if_match": '"e"',
            },
            {"op": "put", "key": "threads/42/w/7/a", "body": "YQ==", "if_none_match": "*"},
            {"op": "delete", "key": "threads/42/w/6/a"},
            {"op": "delete_prefix", "prefix": "threads/42/w/6/"},
        ]
    }


def test_the_ordered_listing_asks_for_what_it_was_given() -> None:
    call = _core.list_snapshots("a/", 10, None, start_after="a/b", order="desc", include_metadata=True)
    assert dict(call.params) == {"prefix": "a/", "start_after": "a/b", "order": "desc", "include": "metadata", "limit": "10"}


def test_metadata_that_is_not_an_object_is_refused_before_sending() -> None:
    with pytest.raises(snapfence.InvalidRequest):
        _core.put_snapshot("k", 1, b"x", metadata=["not", "an", "object"])  # type: ignore[arg-type]
