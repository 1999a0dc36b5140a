//! The Rust client and the CLI under contract v1.3: a write fenced by a namespace's lease, a
//! transaction, metadata and the ordered listing, against a real server.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use snapfence::domain::{KeyPrefix, Metadata};
use snapfence_client::{Error, ListOrder, PutOptions, SnapshotFilter, TxnOp, TxnOpResult};

use crate::harness::TestApp;
use crate::support::{cli, cli_with_stdin, client, grant, key};

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn the_client_writes_under_a_namespace_fence_with_metadata_and_reads_both_back() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let t = grant(&c, &key("threads/7"), "w", TTL).await.lease.token;
    let options = PutOptions {
        fence: Some(key("threads/7")),
        metadata: Some(Metadata::new(json!({"step": 1, "note": "é"})).unwrap()),
        ..PutOptions::default()
    };
    let written = c
        .put_snapshot(&key("threads/7/c/1"), t, "one", &options)
        .await
        .unwrap();
    assert!(written.created);
    assert_eq!(written.meta.fencing_key, Some(key("threads/7")));
    let read = c.get_snapshot(&key("threads/7/c/1")).await.unwrap();
    assert_eq!(read.head.fencing_key, Some(key("threads/7")));
    assert_eq!(read.head.metadata, options.metadata);
    assert_eq!(read.body, Bytes::from("one"));
    app.stop().await;
}

#[tokio::test]
async fn the_clients_namespace_write_with_a_superseded_token_is_stale() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let old = grant(&c, &key("ns"), "a", TTL).await.lease.token;
    c.release(&key("ns"), old).await.unwrap();
    grant(&c, &key("ns"), "b", TTL).await;
    let options = PutOptions {
        fence: Some(key("ns")),
        ..PutOptions::default()
    };
    let e = c
        .put_snapshot(&key("ns/x"), old, "late", &options)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::StaleToken { .. }), "{e:?}");
    app.stop().await;
}

#[tokio::test]
async fn the_client_runs_a_transaction_and_its_failed_precondition_names_the_op() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let fence = key("run/1");
    let t = grant(&c, &fence, "w", TTL).await.lease.token;
    let mut ops: Vec<TxnOp> = (0..10)
        .map(|n| TxnOp::put(key(&format!("run/1/c/{n}")), format!("step {n}")))
        .collect();
    ops.push(TxnOp::Delete {
        key: key("run/1/none"),
    });
    let answer = c.txn(&fence, t, &ops).await.unwrap();
    assert_eq!(answer.results.len(), 11);
    assert!(
        matches!(&answer.results[0], TxnOpResult::Put { created: true, meta } if meta.version.get() == 1)
    );
    assert!(matches!(
        &answer.results[10],
        TxnOpResult::Delete { deleted: false, .. }
    ));
    let again = [
        TxnOp::put(key("run/1/c/0"), "again"),
        TxnOp::Put {
            key: key("run/1/c/1"),
            body: Bytes::from("x"),
            content_type: None,
            metadata: None,
            if_match: None,
            create_only: true,
        },
    ];
    match c.txn(&fence, t, &again).await {
        Err(Error::PreconditionFailed { op_index, .. }) => assert_eq!(op_index, Some(1)),
        other => panic!("{other:?}"),
    }
    let gone = c
        .txn(
            &fence,
            t,
            &[TxnOp::DeletePrefix {
                prefix: KeyPrefix::parse("run/1/c/").unwrap(),
            }],
        )
        .await
        .unwrap();
    assert!(
        matches!(
            &gone.results[0],
            TxnOpResult::DeletePrefix { deleted: 10, .. }
        ),
        "{gone:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_client_lists_keys_in_reverse_after_a_key_with_their_metadata() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let t = grant(&c, &key("l"), "w", TTL).await.lease.token;
    let ops: Vec<TxnOp> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| TxnOp::Put {
            key: key(&format!("l/{n}")),
            body: Bytes::from("x"),
            content_type: None,
            metadata: Some(Metadata::new(json!({"name": n})).unwrap()),
            if_match: None,
            create_only: false,
        })
        .collect();
    c.txn(&key("l"), t, &ops).await.unwrap();
    let page = c
        .list_snapshots(&SnapshotFilter {
            prefix: Some(KeyPrefix::parse("l/").unwrap()),
            order: Some(ListOrder::Desc),
            start_after: Some("l/d".into()),
            with_metadata: true,
            ..SnapshotFilter::default()
        })
        .await
        .unwrap();
    let names: Vec<Value> = page
        .items
        .iter()
        .map(|m| m.metadata.as_ref().unwrap().as_json()["name"].clone())
        .collect();
    assert_eq!(names, [json!("c"), json!("b"), json!("a")]);
    app.stop().await;
}

#[tokio::test]
async fn the_cli_puts_under_a_fence_and_runs_a_transaction_from_json_lines() {
    let app = TestApp::spawn().await;
    let base = &app.instance.base;
    let t = grant(&client(base), &key("job"), "w", TTL)
        .await
        .lease
        .token
        .to_string();
    let put = cli_with_stdin(
        base,
        &[
            "--output",
            "json",
            "snapshot",
            "put",
            "job/a",
            "--fence",
            "job",
            "--token",
            &t,
            "--metadata",
            r#"{"step": 1}"#,
        ],
        b"first",
    )
    .await;
    assert_eq!(put.code, 0, "{}", put.stderr);
    let written: Value = serde_json::from_str(&put.stdout).unwrap();
    assert_eq!(written["fencing_key"], "job");
    assert_eq!(written["metadata"], json!({"step": 1}));
    let lines = b"{\"op\": \"put\", \"key\": \"job/b\", \"text\": \"second\"}\n{\"op\": \"delete\", \"key\": \"job/a\"}\n";
    let txn = cli_with_stdin(
        base,
        &["--output", "json", "txn", "--fence", "job", "--token", &t],
        lines,
    )
    .await;
    assert_eq!(txn.code, 0, "{}", txn.stderr);
    let answer: Value = serde_json::from_str(&txn.stdout).unwrap();
    assert_eq!(answer["results"][0]["key"], "job/b");
    assert_eq!(
        answer["results"][1],
        json!({"key": "job/a", "deleted": true})
    );
    let listed = cli(
        base,
        &[
            "--output",
            "json",
            "snapshot",
            "list",
            "--prefix",
            "job/",
            "--order",
            "desc",
            "--metadata",
        ],
    )
    .await;
    let page: Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert_eq!(page["items"][0]["key"], "job/b");
    let table = cli(base, &["snapshot", "get", "job/b"]).await;
    assert_eq!(table.stdout, "second");
    app.stop().await;
}

#[tokio::test]
async fn the_clis_transaction_refused_by_a_stale_fence_exits_with_the_refusals_code() {
    let app = TestApp::spawn().await;
    let base = &app.instance.base;
    let c = client(base);
    let old = grant(&c, &key("job"), "a", TTL).await.lease.token;
    c.release(&key("job"), old).await.unwrap();
    grant(&c, &key("job"), "b", TTL).await;
    let old = old.to_string();
    let ran = cli_with_stdin(
        base,
        &["txn", "--fence", "job", "--token", &old],
        br#"{"ops": [{"op": "put", "key": "job/x", "text": "late"}]}"#,
    )
    .await;
    assert_ne!(ran.code, 0);
    assert!(ran.stderr.contains("stale"), "{}", ran.stderr);
    let bad = cli_with_stdin(
        base,
        &["txn", "--fence", "job", "--token", &old],
        b"not json",
    )
    .await;
    assert_eq!(
        bad.code, 2,
        "a malformed input is a usage error: {}",
        bad.stderr
    );
    app.stop().await;
}
