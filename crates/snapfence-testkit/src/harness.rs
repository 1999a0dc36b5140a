//! The test harness: one throwaway PostgreSQL cluster per test process (started from the local
//! binaries, or the server at `DATABASE_URL` when set), a database per test, and the service on
//! a free loopback port. Nothing is mocked.
//!
//! A test's database is a [`TestDatabase`]: cloned (`CREATE DATABASE … TEMPLATE`) from one
//! template migrated once per process, or empty where a test needs a database that was never
//! migrated, and dropped when the value is.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use axum_server::tls_rustls::RustlsConfig;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use snapfence::domain::{KeyName, KeyPrefix, Scope};
use snapfence::embedded::{EmbeddedPostgres, Settings};
use snapfence::store::{self, Db, DbSettings, keys};
use snapfence::{AppState, Rules};
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::pgbouncer::PgBouncer;

/// Where test databases are created.
enum Cluster {
    Embedded(EmbeddedPostgres),
    External(Box<PgConnectOptions>),
}

impl Cluster {
    fn options(&self, database: &str) -> PgConnectOptions {
        match self {
            Self::Embedded(pg) => pg.connect_options(database),
            Self::External(base) => base.clone().database(database),
        }
    }
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// The run's cluster, started on first use. An embedded cluster is stopped and removed by a
/// watchdog process once this test process exits, however it exits.
fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| {
        if let Ok(url) = std::env::var("DATABASE_URL") {
            let options = url.parse().expect("DATABASE_URL is a PostgreSQL URL");
            return Cluster::External(Box::new(options));
        }
        let dir = tempfile::Builder::new()
            .prefix("sf-test-")
            .tempdir()
            .expect("a temporary directory")
            .keep();
        let settings = Settings {
            extra: vec![
                // Test clusters are thrown away; the OS page cache is durable enough for them
                // (a killed server still loses nothing), and fsync would dominate run time.
                ("fsync".into(), "off".into()),
                ("max_connections".into(), "400".into()),
                ("shared_buffers".into(), "'64MB'".into()),
            ],
            ..Settings::default()
        };
        // No watchdog yet to remove the directory if the start fails: say what PostgreSQL
        // said, then remove it here.
        let pg = EmbeddedPostgres::start(&dir, &settings).unwrap_or_else(|e| {
            for log in ["tools.log", "postgres.log"] {
                if let Ok(text) = std::fs::read_to_string(dir.join(log)) {
                    eprintln!("{log}:\n{text}");
                }
            }
            std::fs::remove_dir_all(&dir).ok();
            panic!("starting the test cluster: {e}")
        });
        pg.remove_when_process_exits(std::process::id())
            .expect("starting the cluster watchdog");
        Cluster::Embedded(pg)
    })
}

/// With `SNAPFENCE_TEST_POOLER=pgbouncer`, every instance sends its hot statements through one
/// PgBouncer in transaction mode in front of the run's cluster, as `snapfence serve
/// --database-url <pooler> --database-direct-url <postgres>` does.
fn pooler() -> Option<&'static PgBouncer> {
    static POOLER: OnceLock<Option<PgBouncer>> = OnceLock::new();
    POOLER
        .get_or_init(|| match std::env::var("SNAPFENCE_TEST_POOLER").as_deref() {
            Ok("pgbouncer") => Some(
                PgBouncer::start(&cluster().options("postgres"))
                    .expect("starting PgBouncer in front of the test cluster"),
            ),
            Ok("") | Err(_) => None,
            Ok(other) => panic!("SNAPFENCE_TEST_POOLER={other}: the one pooler known is pgbouncer"),
        })
        .as_ref()
}

/// The template every migrated test database is cloned from: made and migrated, as
/// `snapfence serve` migrates, on first use in this process.
static TEMPLATE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();

/// A database of the run's cluster for one test, dropped (with any connection still open to it)
/// when this value is.
pub struct TestDatabase {
    name: String,
    options: PgConnectOptions,
}

impl TestDatabase {
    /// How to connect to it.
    pub fn options(&self) -> &PgConnectOptions {
        &self.options
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        // Drop runs inside the test's runtime, which cannot block on itself: a thread of its
        // own with a runtime of its own does the dropping, and the test waits for it.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop a test database");
            runtime.block_on(async {
                let mut admin = admin().await;
                sqlx::query(&sql).execute(&mut admin).await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(_))) && !std::thread::panicking() {
            eprintln!("could not drop test database {}: {dropped:?}", self.name);
        }
    }
}

/// A connection to the cluster's `postgres` database, for creating and dropping databases.
async fn admin() -> PgConnection {
    PgConnection::connect_with(&cluster().options("postgres"))
        .await
        .expect("connecting to the test cluster")
}

/// Creates a database named for this process, empty or cloned from `template`.
async fn create_database(template: Option<&str>) -> TestDatabase {
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT_DB.fetch_add(1, Ordering::Relaxed)
    );
    let mut admin = admin().await;
    let from = template.map_or_else(String::new, |t| format!(" TEMPLATE {t}"));
    sqlx::query(&format!("CREATE DATABASE {name}{from}"))
        .execute(&mut admin)
        .await
        .expect("creating a test database");
    admin.close().await.ok();
    let options = cluster().options(&name).disable_statement_logging();
    TestDatabase { name, options }
}

/// Ends every session of `database` and waits until they are gone (a generous ceiling: a
/// backend exits in milliseconds, however loaded the machine).
async fn disconnect_all(admin: &mut PgConnection, database: &str) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1",
        )
        .bind(database)
        .fetch_one(&mut *admin)
        .await
        .expect("listing the sessions of a test database");
        if left == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sessions of {database} did not end within 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A fresh, empty database that no migration has touched.
pub async fn fresh_database() -> TestDatabase {
    create_database(None).await
}

/// A fresh database with every migration applied, cloned from the process's template.
pub async fn migrated_database() -> TestDatabase {
    let template = TEMPLATE
        .get_or_init(|| async {
            let name = format!("template_{}", std::process::id());
            let db = create_database(None).await;
            let pool = store::pool(db.options().clone(), &DbSettings::default());
            store::prepare(&pool)
                .await
                .expect("migrating the template database");
            pool.close().await;
            let mut admin = admin().await;
            // A template must have no session while it is cloned, and a closed pool's server
            // processes may still be on their way out: they are ended, and waited for.
            disconnect_all(&mut admin, &db.name).await;
            // Renaming it leaves the guard of `db` nothing to drop, so the template lives as long
            // as the cluster.
            sqlx::query(&format!("ALTER DATABASE {} RENAME TO {name}", db.name))
                .execute(&mut admin)
                .await
                .expect("naming the template database");
            std::mem::forget(db);
            name
        })
        .await;
    create_database(Some(template)).await
}

/// A free loopback port, for a server the test starts to bind it a moment later (PostgreSQL,
/// etcd, HAProxy, `snapfence serve`). Taken below the kernel's ephemeral range: a port from
/// `bind(127.0.0.1:0)` is in that range, and an outgoing connection's source port could take it
/// before the server binds it (HAProxy once failed so). Each call of a process tries the next
/// port after the last it gave, from a start that differs between processes.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // The ephemeral range starts at 32768 unless the machine says otherwise.
    let top = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let bottom = 10_000;
    let span = top.saturating_sub(bottom).max(1);
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = bottom + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(port).expect("below the ephemeral range");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port below {top}: free some, or narrow the ephemeral range");
}

/// A `postgres://` URL for options, for the binary's `--database-url` (a password, if the
/// cluster needs one, comes from `PGPASSWORD` in the inherited environment).
pub fn url_of(options: &PgConnectOptions) -> String {
    let mut url = format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("postgres")
    );
    if let Some(socket) = options.get_socket() {
        url.push_str(&format!("?host={}", socket.display()));
    }
    url
}

/// Test rules: the defaults, with room for a test to change one.
pub fn rules() -> Rules {
    Rules::default()
}

/// One running service instance.
pub struct Instance {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The instance's own pool.
    pub db: PgPool,
    shutdown: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<std::io::Result<()>>>,
    /// The database this instance alone uses, dropped after it (see [`Instance::owning`]).
    database: Option<TestDatabase>,
}

impl Instance {
    /// Starts an instance on a database, migrating it first, as `snapfence serve` does.
    pub async fn start(options: PgConnectOptions, rules: Rules) -> Self {
        Self::start_with_tls(options, rules, None).await
    }

    /// Starts an instance serving HTTPS (`base` is then `https://localhost:PORT`).
    pub async fn start_with_tls(
        options: PgConnectOptions,
        rules: Rules,
        tls: Option<RustlsConfig>,
    ) -> Self {
        let settings = DbSettings {
            pool_size: 8,
            ..DbSettings::default()
        };
        let db = store::pool(options.clone(), &settings);
        store::prepare(&db)
            .await
            .expect("migrating the test database");
        let database = match pooler() {
            Some(bouncer) => {
                let name = options.get_database().unwrap_or("postgres");
                let pooler = store::pooler(bouncer.connect_options(name), &settings);
                Db::with_pooler(db.clone(), pooler)
            }
            None => Db::new(db.clone()),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let port = listener.local_addr().unwrap().port();
        let base = match tls {
            None => format!("http://127.0.0.1:{port}"),
            Some(_) => format!("https://localhost:{port}"),
        };
        let (tx, rx) = oneshot::channel();
        let state = AppState::new(database, rules);
        let served = tokio::spawn(snapfence::run(listener, state, tls, async {
            rx.await.ok();
        }));
        Self {
            base,
            db,
            shutdown: Some(tx),
            served: Some(served),
            database: None,
        }
    }

    /// The instance, made the owner of the database it alone serves, so that the database is
    /// dropped after the instance stops.
    pub fn owning(mut self, database: TestDatabase) -> Self {
        self.database = Some(database);
        self
    }

    /// Stops the instance gracefully and waits until it has.
    pub async fn stop(mut self) {
        self.shutdown.take().map(|tx| tx.send(()));
        if let Some(served) = self.served.take() {
            served.await.expect("the server task").expect("the server");
        }
        self.db.close().await;
        drop(self.database.take());
    }
}

/// An instance serving HTTPS with a fresh self-signed certificate for `localhost`, on a
/// database of its own; returned with the certificate's PEM, for a client to trust.
pub async fn https_instance(rules: Rules) -> (Instance, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
        .expect("a self-signed certificate");
    let dir = tempfile::Builder::new()
        .prefix("sf-tmp-")
        .tempdir()
        .expect("a temporary directory");
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).expect("writing the certificate");
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).expect("writing the key");
    // Read at once: the files may go with `dir`.
    let tls = snapfence::tls_config(&cert_path, &key_path)
        .await
        .expect("loading the certificate");
    let database = migrated_database().await;
    let instance = Instance::start_with_tls(database.options().clone(), rules, Some(tls))
        .await
        .owning(database);
    (instance, cert.cert.pem())
}

/// A test's service: its database, one instance (more on demand) and an HTTP client. The
/// database is dropped with the app.
pub struct TestApp {
    /// The first instance.
    pub instance: Instance,
    /// The database every instance of this app shares.
    pub options: PgConnectOptions,
    /// Drops the database when the app is dropped (declared after `instance`, which is dropped
    /// first).
    _database: TestDatabase,
    /// The rules every instance of this app enforces.
    pub rules: Rules,
    /// A keep-alive HTTP client.
    pub http: reqwest::Client,
}

impl TestApp {
    /// A fresh database and one instance with the default rules.
    pub async fn spawn() -> Self {
        Self::spawn_with(rules()).await
    }

    /// A fresh database and one instance with the given rules.
    pub async fn spawn_with(rules: Rules) -> Self {
        let database = migrated_database().await;
        let options = database.options().clone();
        let instance = Instance::start(options.clone(), rules.clone()).await;
        Self {
            instance,
            options,
            _database: database,
            rules,
            http: reqwest::Client::new(),
        }
    }

    /// Another instance on the same database.
    pub async fn another_instance(&self) -> Instance {
        Instance::start(self.options.clone(), self.rules.clone()).await
    }

    /// The database, for checks that look under the API.
    pub fn db(&self) -> &PgPool {
        &self.instance.db
    }

    /// A request to the first instance.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.instance.base))
    }

    /// A request to a given instance.
    pub fn request_to(&self, instance: &Instance, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", instance.base))
    }

    /// `POST /v1/leases/{key}` with a body.
    pub async fn acquire_with(&self, key: &str, body: Value) -> Response {
        self.request(Method::POST, &format!("/v1/leases/{}", enc(key)))
            .json(&body)
            .send()
            .await
            .expect("acquire")
    }

    /// Acquires a lease that must be granted; returns the grant.
    pub async fn acquire(&self, key: &str, owner: &str, ttl_ms: i64) -> Value {
        let r = self
            .acquire_with(key, json!({"owner": owner, "ttl_ms": ttl_ms}))
            .await;
        assert_eq!(r.status(), StatusCode::CREATED, "acquire {key} as {owner}");
        r.json().await.unwrap()
    }

    /// `PUT /v1/snapshots/{key}` with a token and a body.
    pub async fn put(&self, key: &str, token: i64, body: impl Into<reqwest::Body>) -> Response {
        self.request(Method::PUT, &format!("/v1/snapshots/{}", enc(key)))
            .header("Fencing-Token", token.to_string())
            .body(body)
            .send()
            .await
            .expect("put")
    }

    /// `GET` a path.
    pub async fn get(&self, path: &str) -> Response {
        self.request(Method::GET, path).send().await.expect("get")
    }

    /// `DELETE /v1/leases/{key}` with a token.
    pub async fn release(&self, key: &str, token: i64) -> Response {
        self.request(Method::DELETE, &format!("/v1/leases/{}", enc(key)))
            .header("Fencing-Token", token.to_string())
            .send()
            .await
            .expect("release")
    }

    /// Makes an API key as `snapfence keys create` does, and waits until every running
    /// instance has confirmed it; returns its bearer token.
    pub async fn make_key(&self, name: &str, scope: Scope, prefix: &str) -> String {
        let confirmations = keys::Confirmations::listen(self.db()).await.unwrap();
        let (_, token, change) = keys::create(
            self.db(),
            &KeyName::parse(name).unwrap(),
            scope,
            &KeyPrefix::parse(prefix).unwrap(),
        )
        .await
        .unwrap()
        .expect("a fresh name");
        confirmed(confirmations, change).await;
        token
    }

    /// Revokes a live API key as `snapfence keys revoke` does, and waits until every running
    /// instance has confirmed it.
    pub async fn revoke_key(&self, name: &str) {
        let confirmations = keys::Confirmations::listen(self.db()).await.unwrap();
        let change = keys::revoke(self.db(), &KeyName::parse(name).unwrap())
            .await
            .unwrap()
            .expect("a live key");
        confirmed(confirmations, change).await;
    }

    /// Stops every instance this app started itself.
    pub async fn stop(self) {
        self.instance.stop().await;
    }
}

/// Waits for the confirmations of a change to the keys; every running instance must give one
/// (within a ceiling generous for a loaded machine: they come in milliseconds).
async fn confirmed(confirmations: keys::Confirmations, change: keys::Change) {
    let c = confirmations
        .wait(change, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    assert!(c.silent.is_empty(), "every instance confirms: {c:?}");
}

/// Percent-encodes a key as one path segment.
pub fn enc(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The token of a grant.
pub fn token(grant: &Value) -> i64 {
    grant["token"].as_i64().expect("a grant has a token")
}

/// Asserts a problem+json answer with the given status and code; returns its body.
pub async fn problem(r: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(r.status(), status, "status");
    assert_eq!(
        r.headers()["content-type"],
        "application/problem+json",
        "content type"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], code, "code in {body}");
    assert_eq!(body["status"], status.as_u16());
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "a detail in {body}"
    );
    assert!(body["type"].is_string() && body["title"].is_string());
    body
}
