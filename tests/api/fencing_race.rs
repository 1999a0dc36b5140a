//! The fencing invariant under real concurrency: many workers on two instances over a few keys
//! loop acquire (short TTL) → random pause, sometimes past the TTL → write, and a checker over
//! the recorded history asserts what fencing promises.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::TestApp;

const KEYS: usize = 3;
const WORKERS: usize = 12;
const ROUNDS: usize = 12;
const TTL_MS: u64 = 150;

/// An acknowledged grant.
#[derive(Debug, Clone)]
struct Grant {
    key: String,
    token: i64,
    acked: Instant,
}

/// A write and what the server said of it.
#[derive(Debug, Clone)]
struct Write {
    key: String,
    token: i64,
    invoked: Instant,
    outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Accepted { version: i64 },
    Refused { reason: String, audit_id: i64 },
}

#[derive(Default)]
struct History {
    grants: Vec<Grant>,
    writes: Vec<Write>,
}

/// Every violation of the fencing promises found in a history (empty when it holds).
fn check(h: &History) -> Vec<String> {
    let mut problems = Vec::new();
    let mut accepted: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for w in &h.writes {
        if let Outcome::Accepted { version } = w.outcome {
            accepted.entry(&w.key).or_default().push((version, w.token));
        }
    }
    for (key, mut writes) in accepted {
        writes.sort();
        for (i, pair) in writes.iter().enumerate() {
            if pair.0 != i as i64 + 1 {
                problems.push(format!("{key}: versions not gapless at {pair:?}"));
            }
            if i > 0 && pair.1 < writes[i - 1].1 {
                problems.push(format!("{key}: token decreased at version {}", pair.0));
            }
        }
    }
    for w in &h.writes {
        if !matches!(w.outcome, Outcome::Accepted { .. }) {
            continue;
        }
        for g in h
            .grants
            .iter()
            .filter(|g| g.key == w.key && g.token > w.token)
        {
            if g.acked < w.invoked {
                problems.push(format!(
                    "{}: write with token {} accepted after token {} was granted",
                    w.key, w.token, g.token
                ));
            }
        }
    }
    let mut tokens = HashSet::new();
    for g in &h.grants {
        if !tokens.insert(g.token) {
            problems.push(format!("token {} granted twice", g.token));
        }
    }
    problems
}

#[test]
fn the_checker_finds_each_kind_of_violation() {
    let t0 = Instant::now();
    let later = t0 + Duration::from_millis(10);
    let write = |token, invoked, version| Write {
        key: "k".into(),
        token,
        invoked,
        outcome: Outcome::Accepted { version },
    };
    let grant = |token, acked| Grant {
        key: "k".into(),
        token,
        acked,
    };
    let valid = History {
        grants: vec![grant(1, t0), grant(2, later)],
        writes: vec![write(1, t0, 1), write(2, later, 2)],
    };
    assert!(check(&valid).is_empty());
    let gap = History {
        grants: vec![],
        writes: vec![write(1, t0, 1), write(1, t0, 3)],
    };
    assert_eq!(check(&gap).len(), 1);
    let decreasing = History {
        grants: vec![],
        writes: vec![write(2, t0, 1), write(1, t0, 2)],
    };
    assert_eq!(check(&decreasing).len(), 1);
    let late = History {
        grants: vec![grant(1, t0), grant(2, t0)],
        writes: vec![write(1, later, 1)],
    };
    assert_eq!(check(&late).len(), 1);
    let twice = History {
        grants: vec![grant(1, t0), grant(1, later)],
        writes: vec![],
    };
    assert_eq!(check(&twice).len(), 1);
}

async fn worker(http: reqwest::Client, base: String, id: usize, history: Arc<Mutex<History>>) {
    for round in 0..ROUNDS {
        let key = format!("race-{}", (id + round) % KEYS);
        let r = http
            .post(format!("{base}/v1/leases/{key}"))
            .json(&json!({"owner": format!("w{id}"), "ttl_ms": TTL_MS}))
            .send()
            .await
            .unwrap();
        let acked = Instant::now();
        if r.status() != StatusCode::CREATED {
            let backoff = rand::rng().random_range(5..40);
            tokio::time::sleep(Duration::from_millis(backoff)).await;
            continue;
        }
        let token = r.json::<Value>().await.unwrap()["token"].as_i64().unwrap();
        history.lock().unwrap().grants.push(Grant {
            key: key.clone(),
            token,
            acked,
        });
        // Sometimes well within the TTL, sometimes past it, as a paused holder would.
        let pause = rand::rng().random_range(0..TTL_MS * 2);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let invoked = Instant::now();
        let r = http
            .put(format!("{base}/v1/snapshots/{key}"))
            .header("Fencing-Token", token.to_string())
            .body(format!("{id}:{round}:{token}"))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        let outcome = match status {
            StatusCode::OK | StatusCode::CREATED => Outcome::Accepted {
                version: body["version"].as_i64().unwrap(),
            },
            StatusCode::CONFLICT => Outcome::Refused {
                reason: body["code"].as_str().unwrap().to_string(),
                audit_id: body["audit_id"].as_i64().unwrap(),
            },
            other => panic!("unexpected {other}: {body}"),
        };
        history.lock().unwrap().writes.push(Write {
            key,
            token,
            invoked,
            outcome,
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn accepted_writes_always_carry_the_newest_token_under_racing_holders() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let bases = [app.instance.base.clone(), second.base.clone()];
    let history = Arc::new(Mutex::new(History::default()));
    let tasks: Vec<_> = (0..WORKERS)
        .map(|id| {
            tokio::spawn(worker(
                app.http.clone(),
                bases[id % 2].clone(),
                id,
                history.clone(),
            ))
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let h = std::mem::take(&mut *history.lock().unwrap());
    let problems = check(&h);
    assert!(problems.is_empty(), "{problems:#?}");

    let refused: Vec<(&Write, i64)> = h
        .writes
        .iter()
        .filter_map(|w| match &w.outcome {
            Outcome::Refused { reason, audit_id } => {
                assert_eq!(
                    reason, "stale_token",
                    "a worker only presents tokens it was granted"
                );
                Some((w, *audit_id))
            }
            Outcome::Accepted { .. } => None,
        })
        .collect();
    let accepted = h.writes.len() - refused.len();
    assert!(
        accepted > 0 && !refused.is_empty(),
        "the race exercised both outcomes: {accepted} accepted, {} refused",
        refused.len()
    );

    // Exactly one audit row per refused write, and it describes that write.
    let rows: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT id, key, presented_token FROM rejections ORDER BY id")
            .fetch_all(app.db())
            .await
            .unwrap();
    assert_eq!(rows.len(), refused.len());
    for (w, audit_id) in &refused {
        let row = rows
            .iter()
            .find(|r| r.0 == *audit_id)
            .expect("the refusal's audit row");
        assert_eq!((&row.1, row.2), (&w.key, w.token));
    }

    // The stored snapshot of each key is its last accepted write.
    for k in 0..KEYS {
        let key = format!("race-{k}");
        let last = h
            .writes
            .iter()
            .filter(|w| w.key == key)
            .filter_map(|w| match w.outcome {
                Outcome::Accepted { version } => Some((version, w.token)),
                Outcome::Refused { .. } => None,
            })
            .max();
        let r = app.get(&format!("/v1/snapshots/{key}")).await;
        match last {
            Some((version, token)) => {
                assert_eq!(
                    r.headers()["snapshot-version"],
                    version.to_string().as_str()
                );
                assert_eq!(r.headers()["fencing-token"], token.to_string().as_str());
            }
            None => assert_eq!(r.status(), StatusCode::NOT_FOUND),
        }
    }
    second.stop().await;
    app.stop().await;
}
