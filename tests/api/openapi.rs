//! `openapi.yaml` is kept true by checking it against the running service: its paths are exactly
//! the routed ones, each path answers exactly its documented methods, and a scripted session that
//! reaches every operation and every error code has each answer's status, media type, headers and
//! JSON body checked against the spec.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, token};

fn spec() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("openapi.yaml at the top level");
    serde_norway::from_str(&text).expect("openapi.yaml is YAML")
}

/// Follows a local `$ref` (`#/components/...`) to the object it names.
fn resolve<'a>(spec: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r.strip_prefix('#').expect("local references only");
            resolve(
                spec,
                spec.pointer(pointer)
                    .unwrap_or_else(|| panic!("unresolved {r}")),
            )
        }
        None => v,
    }
}

const METHODS: [&str; 6] = ["get", "head", "post", "put", "delete", "patch"];

/// A concrete path for a template: every parameter filled in with a harmless value.
fn concrete(template: &str) -> String {
    template.replace("{key}", "probe").replace("{version}", "1")
}

#[tokio::test]
async fn the_spec_lists_exactly_the_routed_paths() {
    let spec = spec();
    let documented: BTreeSet<&str> = spec["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let routed: BTreeSet<&str> = snapfence::http::paths().into_iter().collect();
    assert_eq!(documented, routed);
}

#[tokio::test]
async fn every_path_answers_exactly_its_documented_methods() {
    let spec = spec();
    let app = TestApp::spawn().await;
    for (template, item) in spec["paths"].as_object().unwrap() {
        for method in METHODS {
            let r = app
                .request(
                    Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                    &concrete(template),
                )
                .send()
                .await
                .unwrap();
            match item.get(method) {
                Some(op) => {
                    assert_ne!(
                        r.status(),
                        StatusCode::METHOD_NOT_ALLOWED,
                        "{method} {template}"
                    );
                    let status = r.status().as_u16().to_string();
                    assert!(
                        op["responses"].get(&status).is_some(),
                        "{method} {template} answered undocumented {status}"
                    );
                }
                None => assert_eq!(
                    r.status(),
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {template}"
                ),
            }
        }
    }
    app.stop().await;
}

/// Checks answers against the spec and remembers which (operation, status) pairs it saw.
struct Conformance {
    spec: Value,
    seen: BTreeSet<(String, String, u16)>,
    validators: HashMap<String, jsonschema::Validator>,
}

impl Conformance {
    fn new() -> Self {
        Self {
            spec: spec(),
            seen: BTreeSet::new(),
            validators: HashMap::new(),
        }
    }

    /// A validator for a schema of the spec, resolving its references against the whole spec.
    fn validator(&mut self, pointer: &str, schema: &Value) -> &jsonschema::Validator {
        let spec = &self.spec;
        self.validators
            .entry(pointer.to_string())
            .or_insert_with(|| {
                let mut root = spec.clone();
                let object = root.as_object_mut().unwrap();
                for (k, v) in schema.as_object().expect("a schema object") {
                    object.insert(k.clone(), v.clone());
                }
                jsonschema::options()
                    .with_draft(jsonschema::Draft::Draft202012)
                    .build(&root)
                    .unwrap_or_else(|e| panic!("schema at {pointer}: {e}"))
            })
    }

    /// Checks one answer of `method template` and returns its JSON body (or Null).
    async fn check(&mut self, method: &str, template: &str, r: Response) -> Value {
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let bytes = r.bytes().await.unwrap();
        let op = self.spec["paths"][template][method].clone();
        assert!(op.is_object(), "{method} {template} is not in the spec");
        let key = status.to_string();
        let response = resolve(&self.spec, &op["responses"][&key]).clone();
        assert!(
            response.is_object(),
            "{method} {template}: status {status} is not documented"
        );
        self.seen.insert((method.into(), template.into(), status));
        for (name, header) in response["headers"].as_object().into_iter().flatten() {
            let header = resolve(&self.spec, header);
            if header["required"] == true {
                assert!(
                    headers.contains_key(name.as_str()),
                    "{method} {template} {status}: required header {name} missing"
                );
            }
        }
        let Some(content) = response["content"].as_object() else {
            assert!(
                bytes.is_empty(),
                "{method} {template} {status}: undocumented body"
            );
            return Value::Null;
        };
        let media = headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        if method == "head" {
            assert!(bytes.is_empty());
            return Value::Null;
        }
        let entry = content
            .get(&media)
            .or_else(|| content.get("*/*"))
            .unwrap_or_else(|| {
                panic!("{method} {template} {status}: media type {media:?} not documented")
            });
        if !media.contains("json") {
            return Value::Null;
        }
        let body: Value = serde_json::from_slice(&bytes).expect("a JSON body");
        let schema = entry["schema"].clone();
        let pointer = format!("{method} {template} {status} {media}");
        let validator = self.validator(&pointer, &schema);
        let errors: Vec<String> = validator
            .iter_errors(&body)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{pointer}: {body} does not conform: {errors:#?}"
        );
        body
    }
}

#[tokio::test]
async fn answers_conform_to_the_spec_across_every_operation_and_error_code() {
    let app = TestApp::spawn().await;
    let mut c = Conformance::new();
    let lease = "/v1/leases/{key}";
    let snap = "/v1/snapshots/{key}";
    let send = |m: Method, path: &str| app.request(m, path);

    // Leases: grant, held, renew, lost, list, get, not found, bad input.
    // Long enough for the calls that need it live on a loaded machine; the renewal below
    // shortens it to 150 ms, which the expiry further down waits out.
    let body =
        json!({"owner": "a", "ttl_ms": 30000, "metadata": {"pid": 1}, "crash_recovery": true});
    let g = c
        .check(
            "post",
            lease,
            send(Method::POST, "/v1/leases/k")
                .json(&body)
                .send()
                .await
                .unwrap(),
        )
        .await;
    let a = token(&g);
    let held = send(Method::POST, "/v1/leases/k").json(&json!({"owner": "b", "ttl_ms": 1000}));
    c.check("post", lease, held.send().await.unwrap()).await;
    c.check(
        "post",
        lease,
        send(Method::POST, "/v1/leases/k")
            .body("{")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let renewal = json!({"token": a, "ttl_ms": 150});
    let renew = "/v1/leases/{key}/renew";
    c.check(
        "post",
        renew,
        send(Method::POST, "/v1/leases/k/renew")
            .json(&renewal)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let lost = json!({"token": a + 99});
    c.check(
        "post",
        renew,
        send(Method::POST, "/v1/leases/k/renew")
            .json(&lost)
            .send()
            .await
            .unwrap(),
    )
    .await;
    c.check("get", lease, app.get("/v1/leases/k").await).await;
    c.check("get", lease, app.get("/v1/leases/none").await)
        .await;
    c.check(
        "head",
        lease,
        send(Method::HEAD, "/v1/leases/k").send().await.unwrap(),
    )
    .await;
    c.check("get", "/v1/leases", app.get("/v1/leases?limit=1").await)
        .await;
    c.check("get", "/v1/leases", app.get("/v1/leases?limit=0").await)
        .await;
    let long = format!(
        "/v1/leases?prefix={}",
        "p".repeat(snapfence::http::MAX_URI_BYTES)
    );
    c.check("get", "/v1/leases", app.get(&long).await).await;

    // Snapshots: created, updated, read, 304, versions, 412, 428, 400, stale, unknown, 413, delete.
    let put = |token: i64, body: &'static str| {
        send(Method::PUT, "/v1/snapshots/k")
            .header("Fencing-Token", token.to_string())
            .body(body)
    };
    let w = c
        .check("put", snap, put(a, "one").send().await.unwrap())
        .await;
    c.check("put", snap, put(a, "two").send().await.unwrap())
        .await;
    c.check("get", snap, app.get("/v1/snapshots/k").await).await;
    c.check(
        "head",
        snap,
        send(Method::HEAD, "/v1/snapshots/k").send().await.unwrap(),
    )
    .await;
    let etag = w["etag"].as_str().unwrap().to_string();
    let current = app.get("/v1/snapshots/k").await.headers()["etag"].clone();
    let not_modified = send(Method::GET, "/v1/snapshots/k").header("If-None-Match", current);
    c.check("get", snap, not_modified.send().await.unwrap())
        .await;
    let mismatch = put(a, "three").header("If-Match", etag);
    c.check("put", snap, mismatch.send().await.unwrap()).await;
    c.check(
        "put",
        snap,
        send(Method::PUT, "/v1/snapshots/k")
            .body("x")
            .send()
            .await
            .unwrap(),
    )
    .await;
    c.check("put", snap, put(0, "x").send().await.unwrap())
        .await;
    c.check("put", snap, put(a + 50, "x").send().await.unwrap())
        .await;
    let huge = send(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", a.to_string())
        .body(vec![0u8; 8 * 1024 * 1024 + 1]);
    c.check("put", snap, huge.send().await.unwrap()).await;
    let versions = "/v1/snapshots/{key}/versions";
    c.check(
        "get",
        versions,
        app.get("/v1/snapshots/k/versions?limit=1").await,
    )
    .await;
    c.check(
        "get",
        versions,
        app.get("/v1/snapshots/none/versions").await,
    )
    .await;
    c.check(
        "get",
        "/v1/snapshots",
        app.get("/v1/snapshots?limit=1").await,
    )
    .await;
    c.check(
        "get",
        "/v1/snapshots",
        app.get("/v1/snapshots?limit=0").await,
    )
    .await;
    let queue = "/v1/leases/{key}/waiters";
    app.acquire("queued", "holder", 30000).await;
    let waiter = {
        let waiting = send(Method::POST, "/v1/leases/queued")
            .json(&json!({"owner": "w", "ttl_ms": 30000, "wait_ms": 60000}));
        tokio::spawn(waiting.send())
    };
    // A queue with its waiter in it, within a ceiling generous for a loaded machine.
    let listed = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let r = app.get("/v1/leases/queued/waiters").await;
            let page: Value = r.json().await.unwrap();
            if !page["items"].as_array().unwrap().is_empty() {
                break app.get("/v1/leases/queued/waiters").await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the waiter is queued");
    c.check("get", queue, listed).await;
    waiter.abort();
    c.check("get", queue, app.get("/v1/leases/k/waiters?cursor=x").await)
        .await;
    let version = "/v1/snapshots/{key}/versions/{version}";
    c.check("get", version, app.get("/v1/snapshots/k/versions/1").await)
        .await;
    c.check("get", version, app.get("/v1/snapshots/k/versions/99").await)
        .await;
    c.check("get", version, app.get("/v1/snapshots/k/versions/x").await)
        .await;
    c.check("get", snap, app.get("/v1/snapshots/none").await)
        .await;

    // Expiry with crash_recovery: recovery_required, then a stale write, then a reconcile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = send(Method::POST, "/v1/leases/k").json(&json!({"owner": "b", "ttl_ms": 30000}));
    c.check("post", lease, next.send().await.unwrap()).await;
    c.check(
        "get",
        "/v1/leases",
        app.get("/v1/leases?state=recovery_pending").await,
    )
    .await;
    let fix = json!({"owner": "b", "ttl_ms": 30000, "reconciled": true});
    let b = token(
        &c.check(
            "post",
            lease,
            send(Method::POST, "/v1/leases/k")
                .json(&fix)
                .send()
                .await
                .unwrap(),
        )
        .await,
    );
    c.check("put", snap, put(a, "late").send().await.unwrap())
        .await;
    let delete = |token: i64| {
        send(Method::DELETE, "/v1/snapshots/k").header("Fencing-Token", token.to_string())
    };
    c.check("delete", snap, delete(a).send().await.unwrap())
        .await;
    c.check("delete", snap, delete(b).send().await.unwrap())
        .await;
    c.check(
        "delete",
        snap,
        send(Method::DELETE, "/v1/snapshots/k")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let fenced = |action: &str, token: i64| {
        send(Method::POST, &format!("/v1/leases/k/{action}"))
            .header("Fencing-Token", token.to_string())
    };
    let mark = "/v1/leases/{key}/require-recovery";
    c.check(
        "post",
        mark,
        fenced("require-recovery", b).send().await.unwrap(),
    )
    .await;
    c.check(
        "post",
        mark,
        fenced("require-recovery", a).send().await.unwrap(),
    )
    .await;
    let abandon = "/v1/leases/{key}/abandon";
    c.check("post", abandon, fenced("abandon", b).send().await.unwrap())
        .await;
    c.check("post", abandon, fenced("abandon", b).send().await.unwrap())
        .await;
    c.check(
        "post",
        abandon,
        send(Method::POST, "/v1/leases/k/abandon")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let blocked = send(Method::POST, "/v1/leases/k").json(&json!({"owner": "c", "ttl_ms": 30000}));
    c.check("post", lease, blocked.send().await.unwrap()).await;
    // v1.2: both reconcile flags refused; a reconciling grant keeps the record until confirmed.
    let both = json!({"owner": "c", "ttl_ms": 30000, "reconciled": true, "reconciling": true});
    let both = send(Method::POST, "/v1/leases/k").json(&both);
    c.check("post", lease, both.send().await.unwrap()).await;
    let c_grant = c
        .check(
            "post",
            lease,
            send(Method::POST, "/v1/leases/k")
                .json(&json!({"owner": "c", "ttl_ms": 30000, "reconciling": true}))
                .send()
                .await
                .unwrap(),
        )
        .await;
    assert!(c_grant["recovery"].is_object(), "{c_grant}");
    let c_token = token(&c_grant);
    c.check("get", lease, app.get("/v1/leases/k").await).await;
    let confirm = "/v1/leases/{key}/reconciled";
    c.check(
        "post",
        confirm,
        fenced("reconciled", c_token + 1).send().await.unwrap(),
    )
    .await;
    c.check(
        "post",
        confirm,
        send(Method::POST, "/v1/leases/k/reconciled")
            .send()
            .await
            .unwrap(),
    )
    .await;
    c.check(
        "post",
        confirm,
        fenced("reconciled", c_token).send().await.unwrap(),
    )
    .await;
    let release = |token: i64| {
        send(Method::DELETE, "/v1/leases/k").header("Fencing-Token", token.to_string())
    };
    c.check("delete", lease, release(c_token).send().await.unwrap())
        .await;
    c.check("delete", lease, release(c_token).send().await.unwrap())
        .await;
    c.check(
        "delete",
        lease,
        send(Method::DELETE, "/v1/leases/k").send().await.unwrap(),
    )
    .await;

    // v1.3: a write under a namespace fence, its read and listing, and a transaction's answers.
    let n = token(&app.acquire("ns", "o", 30000).await);
    let under = send(Method::PUT, "/v1/snapshots/ns%2Fa")
        .header("Fencing-Token", n.to_string())
        .header("Fencing-Key", "ns")
        .header("Snapshot-Metadata", r#"{"step":1}"#)
        .body("a");
    c.check("put", snap, under.send().await.unwrap()).await;
    c.check("get", snap, app.get("/v1/snapshots/ns%2Fa").await)
        .await;
    let listed = "/v1/snapshots?prefix=ns/&include=metadata&order=desc";
    c.check("get", "/v1/snapshots", app.get(listed).await).await;
    let txn = "/v1/txn";
    let run = |t: i64, ops: Value| {
        send(Method::POST, txn)
            .header("Fencing-Token", t.to_string())
            .header("Fencing-Key", "ns")
            .json(&json!({ "ops": ops }))
    };
    let ops = json!([
        {"op": "put", "key": "ns/b", "body": "Yg==", "metadata": {"step": 2}},
        {"op": "delete", "key": "ns/none"},
        {"op": "delete_prefix", "prefix": "ns/a"}
    ]);
    c.check("post", txn, run(n, ops.clone()).send().await.unwrap())
        .await;
    let create = json!([{"op": "put", "key": "ns/b", "body": "", "if_none_match": "*"}]);
    c.check("post", txn, run(n, create).send().await.unwrap())
        .await;
    c.check("post", txn, run(n + 50, ops.clone()).send().await.unwrap())
        .await;
    c.check("post", txn, run(n, json!([])).send().await.unwrap())
        .await;
    let unfenced = send(Method::POST, txn).json(&json!({ "ops": ops }));
    c.check("post", txn, unfenced.send().await.unwrap()).await;

    // Audit logs and operations.
    for log in ["/v1/audit/rejections", "/v1/audit/recoveries"] {
        c.check("get", log, app.get(&format!("{log}?limit=1")).await)
            .await;
        c.check(
            "get",
            log,
            app.get(&format!("{log}?key=k&since=2020-01-01T00:00:00Z"))
                .await,
        )
        .await;
        c.check("get", log, app.get(&format!("{log}?reason=nonsense")).await)
            .await;
    }
    // A watch's stream is the next test's; its refusals are answers like any other.
    c.check("get", "/v1/watch", app.get("/v1/watch?since=x").await)
        .await;
    c.check("get", "/healthz", app.get("/healthz").await).await;
    for asset in snapfence::http::ui::ASSETS {
        c.check("get", asset.path, app.get(asset.path).await).await;
    }
    c.check("get", "/readyz", app.get("/readyz").await).await;
    c.check("get", "/metrics", app.get("/metrics").await).await;

    // Authentication: once a key exists, no key is 401 and a too-narrow key 403.
    let reader = app
        .make_key("reader", snapfence::domain::Scope::Read, "")
        .await;
    c.check("get", "/v1/leases", app.get("/v1/leases").await)
        .await;
    let narrow = send(Method::POST, "/v1/leases/k2")
        .header("Authorization", format!("Bearer {reader}"))
        .json(&json!({"owner": "r", "ttl_ms": 30000}));
    c.check("post", lease, narrow.send().await.unwrap()).await;

    // Every operation of the spec was reached at least once.
    let reached: BTreeSet<(String, String)> = c
        .seen
        .iter()
        .map(|(m, t, _)| (m.clone(), t.clone()))
        .collect();
    for (template, item) in c.spec["paths"].as_object().unwrap() {
        for method in METHODS
            .iter()
            .filter(|m| item.get(**m).is_some() && **m != "head")
        {
            assert!(
                reached.contains(&(method.to_string(), template.clone())),
                "{method} {template} was not exercised"
            );
        }
    }
    app.stop().await;
}

#[tokio::test]
async fn answers_of_the_watch_conform_to_the_spec() {
    let mut rules = crate::harness::rules();
    // Streams that end, so that their bodies can be read whole; a history that is pruned.
    rules.max_watch = Duration::from_millis(200);
    rules.watch_retention = Duration::from_millis(200);
    let app = TestApp::spawn_with(rules).await;
    let mut c = Conformance::new();
    let watch = "/v1/watch";
    // Two changes: once both are pruned, id 1 is older than the history (0 is the oldest kept).
    app.acquire("w", "o", 30000).await;
    app.acquire("w2", "o", 30000).await;
    c.check("get", watch, app.get("/v1/watch").await).await;
    // An id above the newest.
    c.check(
        "get",
        watch,
        app.get(&format!("/v1/watch?since={}", i64::MAX)).await,
    )
    .await;
    c.check(
        "head",
        watch,
        app.request(Method::HEAD, watch).send().await.unwrap(),
    )
    .await;
    c.check("get", watch, app.get("/v1/watch?since=-1").await)
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = app.get("/v1/watch?since=1").await;
        let status = r.status();
        c.check("get", watch, r).await;
        if status == StatusCode::GONE {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never compacted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = app
        .request(Method::HEAD, "/v1/watch?since=1")
        .send()
        .await
        .unwrap();
    c.check("head", watch, gone).await;
    let reader = app
        .make_key("confined", snapfence::domain::Scope::Read, "a/")
        .await;
    let outside = app
        .request(Method::GET, "/v1/watch?prefix=b")
        .header("Authorization", format!("Bearer {reader}"));
    c.check("get", watch, outside.send().await.unwrap()).await;
    app.stop().await;
}

#[tokio::test]
async fn answers_of_the_limits_per_key_and_on_bodies_conform_to_the_spec() {
    let mut rules = crate::harness::rules();
    rules.rate_limit_per_key = Some(snapfence::rules::RateLimit {
        per_second: 0.1,
        burst: std::num::NonZeroU32::MIN,
    });
    rules.max_body_bytes_in_flight = 1024;
    let app = TestApp::spawn_with(rules).await;
    let mut c = Conformance::new();
    let (lease, snap) = ("/v1/leases/{key}", "/v1/snapshots/{key}");
    let grant = app.acquire("k", "a", 30000).await;
    // Bodies over the budget: a snapshot, and a lease request (within its own limit).
    let big = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", token(&grant).to_string())
        .body(vec![0u8; 2048]);
    c.check("put", snap, big.send().await.unwrap()).await;
    let metadata = json!({"note": "n".repeat(2048)});
    let big = app
        .request(Method::POST, "/v1/leases/j")
        .json(&json!({"owner": "a", "ttl_ms": 30000, "metadata": metadata}));
    c.check("post", lease, big.send().await.unwrap()).await;
    // A key over its rate of one request per 10 s.
    let reader = app
        .make_key("reader", snapfence::domain::Scope::Read, "")
        .await;
    for method in [Method::GET, Method::GET, Method::HEAD] {
        let r = app
            .request(method.clone(), "/v1/leases")
            .header("Authorization", format!("Bearer {reader}"));
        let name = method.as_str().to_lowercase();
        c.check(&name, "/v1/leases", r.send().await.unwrap()).await;
    }
    let statuses: BTreeSet<u16> = c.seen.iter().map(|(_, _, status)| *status).collect();
    assert_eq!(statuses, BTreeSet::from([200, 429, 503]));
    app.stop().await;
}

#[test]
fn the_entity_tag_header_patterns_accept_exactly_what_the_server_parses() {
    let spec = spec();
    // Every string of up to 5 characters over the characters that matter to the grammar.
    let alphabet = ['W', '/', '"', ',', ' ', '\t', '*', 'a', '!'];
    let mut candidates = vec![String::new()];
    let mut layer = vec![String::new()];
    for _ in 0..5 {
        layer = layer
            .iter()
            .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
            .collect();
        candidates.extend(layer.iter().cloned());
    }
    candidates.extend(
        [
            "\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"",
            "W/\"x\", \"y\" ,z",
            "\"h`A/;YBnA*]%\", \"q4kel_TD8o1)\", \"\"",
            "\"caf\u{e9}\"",
            "a\u{7f}",
        ]
        .map(String::from),
    );
    for name in ["IfMatch", "IfNoneMatch"] {
        let schema = &spec["components"]["parameters"][name]["schema"];
        let pattern = jsonschema::validator_for(schema).expect("a valid schema");
        for raw in &candidates {
            assert_eq!(
                pattern.is_valid(&json!(raw)),
                snapfence::domain::EntityTagCondition::parse(raw).is_ok(),
                "{name} {raw:?}: the spec's pattern and the server disagree"
            );
        }
    }
}

#[test]
fn the_spec_lists_exactly_the_error_codes_the_service_answers_with() {
    let spec = spec();
    let listed: BTreeSet<&str> = spec["components"]["schemas"]["ProblemCode"]["enum"]
        .as_array()
        .expect("ProblemCode is an enum")
        .iter()
        .map(|v| v.as_str().expect("codes are strings"))
        .collect();
    let known: BTreeSet<&str> = snapfence::domain::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(
        listed, known,
        "openapi.yaml's ProblemCode and ErrorCode::ALL"
    );
}

#[test]
fn the_operator_pages_headers_in_the_spec_are_the_ones_served() {
    let spec = spec();
    let headers = &spec["components"]["headers"];
    assert_eq!(
        headers["ContentSecurityPolicy"]["schema"]["const"],
        snapfence::http::ui::CONTENT_SECURITY_POLICY
    );
    assert_eq!(headers["ContentTypeOptions"]["schema"]["const"], "nosniff");
    for asset in snapfence::http::ui::ASSETS {
        let content = &spec["paths"][asset.path]["get"]["responses"]["200"]["content"];
        assert!(
            content.get(asset.content_type).is_some(),
            "{} is documented as {}",
            asset.path,
            asset.content_type
        );
    }
}
