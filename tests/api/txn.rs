//! Transactions (`POST /v1/txn`, contract v1.3): one test per rule, then transactions racing
//! on two instances, all or nothing.

use std::sync::Arc;

use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, problem, token};

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// `POST /v1/txn` fenced by the lease on `fence`.
async fn txn(app: &TestApp, fence: &str, t: i64, ops: Value) -> reqwest::Response {
    app.request(Method::POST, "/v1/txn")
        .header("Fencing-Key", crate::harness::enc(fence))
        .header("Fencing-Token", t.to_string())
        .json(&json!({ "ops": ops }))
        .send()
        .await
        .unwrap()
}

/// Ten puts under `thread`, each with a body naming `tag`.
fn ten_puts(thread: &str, tag: &str) -> Value {
    Value::Array(
        (0..10)
            .map(|n| json!({"op": "put", "key": format!("{thread}/c/{n:04}"), "body": b64(&format!("{tag}:{n}")),
                "content_type": "application/json", "metadata": {"step": n}}))
            .collect(),
    )
}

async fn count(app: &TestApp, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(app.db()).await.unwrap()
}

#[tokio::test]
async fn a_ten_put_transaction_commits_every_put_and_answers_each_in_order() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("threads/1", "w", 30000).await);
    let r = txn(&app, "threads/1", t, ten_puts("threads/1", "a")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["token"], t);
    assert_eq!(answer["fencing_key"], "threads/1");
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 10);
    for (n, result) in results.iter().enumerate() {
        assert_eq!(result["key"], format!("threads/1/c/{n:04}"));
        assert_eq!(result["version"], 1);
        assert_eq!(result["created"], true);
        assert_eq!(result["content_type"], "application/json");
        assert_eq!(result["metadata"]["step"], n);
        let got = app
            .get(&format!("/v1/snapshots/threads%2F1%2Fc%2F{n:04}"))
            .await;
        assert_eq!(got.headers()["etag"].to_str().unwrap(), result["etag"]);
        assert_eq!(got.text().await.unwrap(), format!("a:{n}"));
    }
    app.stop().await;
}

#[tokio::test]
async fn a_failed_precondition_writes_nothing_and_names_its_op() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("th", "w", 30000).await);
    assert_eq!(
        app.request(Method::PUT, "/v1/snapshots/th%2Fx")
            .header("Fencing-Key", "th")
            .header("Fencing-Token", t.to_string())
            .body("old")
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let ops = json!([
        {"op": "put", "key": "th/a", "body": b64("1")},
        {"op": "put", "key": "th/x", "body": b64("2"), "if_match": "\"not-the-etag\""},
        {"op": "delete", "key": "th/y"},
    ]);
    let p = problem(
        txn(&app, "th", t, ops).await,
        StatusCode::PRECONDITION_FAILED,
        "precondition_failed",
    )
    .await;
    assert_eq!(p["op_index"], 1);
    assert_eq!(app.get("/v1/snapshots/th%2Fa").await.status(), 404);
    assert_eq!(
        app.get("/v1/snapshots/th%2Fx").await.text().await.unwrap(),
        "old"
    );
    assert_eq!(count(&app, "SELECT count(*) FROM rejections").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn if_none_match_star_creates_only() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("th", "w", 30000).await);
    let create = json!([{"op": "put", "key": "th/a", "body": b64("1"), "if_none_match": "*"}]);
    assert_eq!(
        txn(&app, "th", t, create.clone()).await.status(),
        StatusCode::OK
    );
    let p = problem(
        txn(&app, "th", t, create).await,
        StatusCode::PRECONDITION_FAILED,
        "precondition_failed",
    )
    .await;
    assert_eq!(p["op_index"], 0);
    app.stop().await;
}

#[tokio::test]
async fn if_match_with_the_current_etag_commits() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("th", "w", 30000).await);
    let first: Value = txn(
        &app,
        "th",
        t,
        json!([{"op": "put", "key": "th/a", "body": b64("1")}]),
    )
    .await
    .json()
    .await
    .unwrap();
    let etag = first["results"][0]["etag"].as_str().unwrap();
    let r = txn(
        &app,
        "th",
        t,
        json!([{"op": "put", "key": "th/a", "body": b64("2"), "if_match": etag}]),
    )
    .await;
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["results"][0]["version"], 2);
    assert_eq!(answer["results"][0]["created"], false);
    app.stop().await;
}

#[tokio::test]
async fn a_stale_fence_refuses_the_whole_transaction_with_one_audit_row() {
    let app = TestApp::spawn().await;
    let old = token(&app.acquire("th", "a", 30000).await);
    app.release("th", old).await;
    let new = token(&app.acquire("th", "b", 30000).await);
    let p = problem(
        txn(&app, "th", old, ten_puts("th", "late")).await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    assert_eq!(p["fencing_key"], "th");
    assert_eq!(p["highest_token"], new);
    assert_eq!(
        count(&app, "SELECT count(*) FROM snapshot_versions").await,
        0
    );
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT key, operation, fencing_key FROM rejections")
            .fetch_all(app.db())
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![("th/c/0000".into(), "txn".into(), Some("th".into()))]
    );
    app.stop().await;
}

#[tokio::test]
async fn a_key_that_went_forward_refuses_the_whole_transaction() {
    let app = TestApp::spawn().await;
    let outer = token(&app.acquire("th", "outer", 30000).await);
    let inner = token(&app.acquire("th/c/0005", "inner", 30000).await);
    assert_eq!(app.put("th/c/0005", inner, "own").await.status(), 201);
    let p = problem(
        txn(&app, "th", outer, ten_puts("th", "x")).await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    assert_eq!(p["highest_token"], inner);
    assert_eq!(
        count(&app, "SELECT count(*) FROM snapshot_versions").await,
        1
    );
    let key: String = sqlx::query_scalar("SELECT key FROM rejections")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(key, "th/c/0005", "the audit row names the key it failed on");
    app.stop().await;
}

#[tokio::test]
async fn deletes_and_prefix_deletes_answer_what_they_removed() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("th", "w", 30000).await);
    assert_eq!(txn(&app, "th", t, ten_puts("th", "a")).await.status(), 200);
    let w = json!([{"op": "put", "key": "th/w/1/a", "body": b64("w")}, {"op": "put", "key": "th/w/1/b", "body": b64("w")}]);
    assert_eq!(txn(&app, "th", t, w).await.status(), 200);
    let ops = json!([
        {"op": "delete", "key": "th/c/0000"},
        {"op": "delete", "key": "th/none"},
        {"op": "delete_prefix", "prefix": "th/w/"},
    ]);
    let answer: Value = txn(&app, "th", t, ops).await.json().await.unwrap();
    assert_eq!(
        answer["results"],
        json!([
            {"key": "th/c/0000", "deleted": true},
            {"key": "th/none", "deleted": false},
            {"prefix": "th/w/", "deleted": 2},
        ])
    );
    for gone in ["th%2Fc%2F0000", "th%2Fw%2F1%2Fa", "th%2Fw%2F1%2Fb"] {
        assert_eq!(
            app.get(&format!("/v1/snapshots/{gone}")).await.status(),
            404
        );
        assert_eq!(
            app.get(&format!("/v1/snapshots/{gone}/versions"))
                .await
                .status(),
            404
        );
    }
    let left = count(
        &app,
        "SELECT count(*) FROM snapshot_versions WHERE key LIKE 'th/w/%' OR key = 'th/c/0000'",
    )
    .await;
    assert_eq!(left, 0, "their versions are removed");
    assert_eq!(app.get("/v1/snapshots/th%2Fc%2F0001").await.status(), 200);
    app.stop().await;
}

#[tokio::test]
async fn a_prefix_delete_past_the_bound_is_400_and_deletes_nothing() {
    let app = TestApp::spawn_with(snapfence::Rules {
        max_txn_prefix_keys: 5,
        ..crate::harness::rules()
    })
    .await;
    let t = token(&app.acquire("th", "w", 30000).await);
    assert_eq!(txn(&app, "th", t, ten_puts("th", "a")).await.status(), 200);
    let r = txn(
        &app,
        "th",
        t,
        json!([{"op": "delete_prefix", "prefix": "th/c/"}]),
    )
    .await;
    let p = problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    assert!(p["detail"].as_str().unwrap().contains("pages"), "{p}");
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM snapshot_heads WHERE etag IS NOT NULL"
        )
        .await,
        10
    );
    app.stop().await;
}

#[tokio::test]
async fn a_malformed_transaction_is_400_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("th", "w", 30000).await);
    let cases = [
        json!([]),
        json!([{"op": "put", "key": "other/a", "body": b64("1")}]),
        json!([{"op": "put", "key": "th/a", "body": b64("1")}, {"op": "delete", "key": "th/a"}]),
        json!([{"op": "put", "key": "th/w/a", "body": b64("1")}, {"op": "delete_prefix", "prefix": "th/w/"}]),
        json!([{"op": "delete_prefix", "prefix": "th/w/"}, {"op": "delete_prefix", "prefix": "th/w/x"}]),
        json!([{"op": "delete_prefix", "prefix": "t"}]),
        json!([{"op": "put", "key": "th/a", "body": "not base64!"}]),
        json!([{"op": "put", "key": "th/a", "body": b64("1"), "if_none_match": "\"x\""}]),
        json!([{"op": "rename", "key": "th/a"}]),
        json!([{"op": "put", "key": "th/a", "body": b64("1"), "metadata": [1]}]),
        Value::Array(
            (0..129)
                .map(|n| json!({"op": "delete", "key": format!("th/{n}")}))
                .collect(),
        ),
    ];
    for ops in cases {
        let r = txn(&app, "th", t, ops.clone()).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{ops}");
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let no_fence = app
        .request(Method::POST, "/v1/txn")
        .header("Fencing-Token", t.to_string())
        .json(&json!({"ops": [{"op": "delete", "key": "th/a"}]}))
        .send()
        .await
        .unwrap();
    problem(no_fence, StatusCode::BAD_REQUEST, "invalid_request").await;
    let no_token = app
        .request(Method::POST, "/v1/txn")
        .header("Fencing-Key", "th")
        .json(&json!({"ops": [{"op": "delete", "key": "th/a"}]}))
        .send()
        .await
        .unwrap();
    problem(
        no_token,
        StatusCode::PRECONDITION_REQUIRED,
        "token_required",
    )
    .await;
    assert_eq!(count(&app, "SELECT count(*) FROM snapshot_heads").await, 0);
    assert_eq!(count(&app, "SELECT count(*) FROM rejections").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_transaction_sent_again_with_its_idempotency_key_is_answered_again_and_done_once() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("th", "w", 30000).await);
    let send = || {
        app.request(Method::POST, "/v1/txn")
            .header("Fencing-Key", "th")
            .header("Fencing-Token", t.to_string())
            .header("Idempotency-Key", "txn-1")
            .json(&json!({"ops": ten_puts("th", "once")}))
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();
    let again = send().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    assert_eq!(
        count(&app, "SELECT count(*) FROM snapshot_versions").await,
        10
    );
    let other = app
        .request(Method::POST, "/v1/txn")
        .header("Fencing-Key", "th")
        .header("Fencing-Token", t.to_string())
        .header("Idempotency-Key", "txn-1")
        .json(&json!({"ops": ten_puts("th", "other")}))
        .send()
        .await
        .unwrap();
    problem(
        other,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    app.stop().await;
}

/// Transactions of ten puts from two instances, their holders taking the namespace in turn and
/// some stalling past their TTL: each transaction is written whole or not at all, and each
/// refusal is audited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_racing_from_two_instances_are_all_or_nothing() {
    let app = Arc::new(
        TestApp::spawn_with(snapfence::Rules {
            keep_versions: 100_000,
            ..crate::harness::rules()
        })
        .await,
    );
    let second = Arc::new(app.another_instance().await);
    let mut tasks = Vec::new();
    for w in 0..6 {
        let (app, second) = (app.clone(), second.clone());
        tasks.push(tokio::spawn(async move {
            let via = |m: Method, p: &str| {
                if w % 2 == 0 {
                    app.request(m, p)
                } else {
                    app.request_to(&second, m, p)
                }
            };
            let mut mine = Vec::new();
            for round in 0..5 {
                let grant = via(Method::POST, "/v1/leases/th")
                    .json(&json!({"owner": format!("w{w}"), "ttl_ms": 200, "wait_ms": 5000}))
                    .send()
                    .await
                    .unwrap();
                if grant.status() != StatusCode::CREATED {
                    continue;
                }
                let t = token(&grant.json().await.unwrap());
                if (w + round) % 3 == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                let tag = format!("w{w}r{round}");
                let r = via(Method::POST, "/v1/txn")
                    .header("Fencing-Key", "th")
                    .header("Fencing-Token", t.to_string())
                    .json(&json!({"ops": ten_puts("th", &tag)}))
                    .send()
                    .await
                    .unwrap();
                mine.push((tag, r.status().as_u16()));
                via(Method::DELETE, "/v1/leases/th")
                    .header("Fencing-Token", t.to_string())
                    .send()
                    .await
                    .unwrap();
            }
            mine
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.extend(t.await.unwrap());
    }
    let bodies: Vec<Vec<u8>> = sqlx::query_scalar("SELECT body FROM snapshot_versions")
        .fetch_all(app.db())
        .await
        .unwrap();
    let bodies: Vec<String> = bodies
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap())
        .collect();
    let mut refused = 0;
    for (tag, status) in &outcomes {
        let written = bodies
            .iter()
            .filter(|b| b.starts_with(&format!("{tag}:")))
            .count();
        match status {
            200 => assert_eq!(written, 10, "{tag} committed whole"),
            409 => {
                assert_eq!(written, 0, "{tag} refused whole");
                refused += 1;
            }
            other => panic!("{tag}: unexpected {other}"),
        }
    }
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM rejections WHERE operation = 'txn'"
        )
        .await,
        refused
    );
    assert!(
        refused > 0 && refused < outcomes.len() as i64,
        "{outcomes:?}"
    );
    Arc::try_unwrap(second).ok().unwrap().stop().await;
    Arc::try_unwrap(app).ok().unwrap().stop().await;
}

/// Transactions sent at once to one instance share batches (their changes commit in one
/// PostgreSQL transaction), and each is still decided by its own fence and preconditions: a stale
/// one refused alone with its audit row, one with a failed precondition alone, the rest whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_sent_together_share_batches_and_are_each_decided_alone() {
    let app = Arc::new(TestApp::spawn().await);
    let mut prepared = Vec::new();
    for n in 0..24 {
        let fence = format!("run/{n}");
        let t = token(&app.acquire(&fence, "w", 30000).await);
        if n % 4 == 0 {
            app.release(&fence, t).await;
            app.acquire(&fence, "successor", 30000).await;
        }
        let mut ops = ten_puts(&fence, &format!("r{n}"));
        if n % 4 == 1 {
            ops[3]["if_match"] = json!("\"not-there\"");
        }
        prepared.push((n, fence, t, ops));
    }
    let start = Arc::new(tokio::sync::Barrier::new(prepared.len()));
    let sends: Vec<_> = prepared
        .into_iter()
        .map(|(n, fence, t, ops)| {
            let (app, start) = (app.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let r = txn(&app, &fence, t, ops).await;
                (n, r.status(), r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    for send in sends {
        let (n, status, body) = send.await.unwrap();
        let written = count(
            &app,
            &format!("SELECT count(*) FROM snapshot_versions WHERE key LIKE 'run/{n}/%'"),
        )
        .await;
        match n % 4 {
            0 => {
                assert_eq!(status, StatusCode::CONFLICT, "{n}: {body}");
                assert_eq!(body["code"], "stale_token");
                assert_eq!(written, 0);
            }
            1 => {
                assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{n}: {body}");
                assert_eq!(body["op_index"], 3, "the op within its own transaction");
                assert_eq!(written, 0);
            }
            _ => {
                assert_eq!(status, StatusCode::OK, "{n}: {body}");
                assert_eq!(body["results"].as_array().unwrap().len(), 10);
                assert_eq!(written, 10);
            }
        }
    }
    let refused: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT key, fencing_key FROM rejections ORDER BY fencing_key")
            .fetch_all(app.db())
            .await
            .unwrap();
    let mut expected: Vec<(String, Option<String>)> = (0..24)
        .filter(|n| n % 4 == 0)
        .map(|n| (format!("run/{n}/c/0000"), Some(format!("run/{n}"))))
        .collect();
    expected.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(refused, expected, "one audit row per refused transaction");
    let (fences, xids): (i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT fencing_key), count(DISTINCT xid::text) FROM change_log \
         WHERE kind = 'snapshot.written'",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(fences, 12);
    assert!(
        xids < fences,
        "{fences} transactions committed in {xids} PostgreSQL transactions: none shared a batch"
    );
    Arc::try_unwrap(app).ok().unwrap().stop().await;
}
