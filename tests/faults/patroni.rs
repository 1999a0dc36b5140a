//! The high-availability stack PostgreSQL users run, for the scenarios of `ha`: a one-member
//! etcd as the consensus store, three PostgreSQL nodes under Patroni, and HAProxy in front,
//! routing to whichever node Patroni's REST API calls the primary. All of it is Debian's
//! packages (`patroni`, `etcd-server`, `haproxy`) started from here, on loopback ports, in a
//! scratch directory that the unprivileged `postgres` user owns when the tests run as root.
//!
//! Two loopback proxies per node stand for the network the tests cut: one between the node's
//! Patroni and etcd (a node cut off from the consensus store while its clients still reach it)
//! and one that the other nodes replicate from (the node's `connect_address`: a standby that
//! falls behind). Clients reach PostgreSQL through HAProxy, never through these.
//!
//! Patroni talks to etcd over its v2 API (`etcd:`, etcd started with `--enable-v2`), not v3:
//! Patroni 3.0.2's v3 client (Debian bookworm's) renews its leader key with an unconditional
//! put, so a leader whose loop was held up past the TTL takes the key back from the node that
//! was promoted meanwhile, and that node's acknowledged writes are rewound away. Patroni 3.0.3
//! compares before it writes (patroni/patroni#2689); the v2 client always did.
//!
//! Every process is stopped by its process id when the cluster is dropped, and by a watchdog
//! if the test process dies first; the scratch directory goes with them.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Gid, Pid, Uid, User};
use reqwest::StatusCode;
use sqlx::Connection;

use crate::cluster::{
    DATABASE, blocking, children_of, detached_watchdog, free_port, scratch, signal_server, tcp_url,
    try_signal_server,
};
use crate::proxy::Proxy;

/// Patroni's timings: a leader key lapses `TTL` seconds after its last renewal, each node runs
/// its loop every `LOOP_WAIT` seconds, and gives up on etcd or PostgreSQL after `RETRY_TIMEOUT`.
/// Patroni wants `LOOP_WAIT + 2 * RETRY_TIMEOUT <= TTL`, so that a leader cut off from etcd
/// demotes itself before its key lapses. Production's defaults are 30, 10 and 10; these make a
/// failover take seconds rather than half a minute, which loopback and an idle etcd allow.
pub const TTL: u64 = 8;
const LOOP_WAIT: u64 = 1;
const RETRY_TIMEOUT: u64 = 3;
const _: () = assert!(LOOP_WAIT + 2 * RETRY_TIMEOUT <= TTL);

/// How long the stack may take to come up, or a node to take over: bootstrap runs initdb and
/// two base backups, which a loaded machine can make slow.
const STARTUP: Duration = Duration::from_secs(180);

/// Where a tool is: on `PATH`, or in the `sbin` directories a non-root `PATH` may lack
/// (HAProxy's).
fn tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found (on PATH or in /usr/sbin): the Patroni scenarios run Debian's \
                 patroni, etcd-server and haproxy. Install them (`apt-get install -y patroni \
                 etcd-server haproxy`, which `scripts/test` does as root when they are missing), or set \
                 SNAPFENCE_FAULTS_PATRONI=skip to skip these scenarios; {package} provides {name}"
            )
        })
}

/// Whether the Patroni scenarios are to be skipped (`SNAPFENCE_FAULTS_PATRONI=skip`), as the
/// browser tests are with `SNAPFENCE_UI_BROWSER=skip`: otherwise a missing tool fails them.
pub fn skipped() -> bool {
    let skip = std::env::var("SNAPFENCE_FAULTS_PATRONI").as_deref() == Ok("skip");
    if skip {
        eprintln!("SNAPFENCE_FAULTS_PATRONI=skip: Patroni scenario skipped");
    }
    skip
}

/// The user the stack runs as: `postgres` when the tests run as root (PostgreSQL refuses
/// root), else the tests' own user.
fn run_as() -> Option<(Uid, Gid)> {
    if !Uid::effective().is_root() {
        return None;
    }
    let user = User::from_name("postgres").ok().flatten().expect(
        "running as root, the Patroni scenarios run PostgreSQL as the `postgres` user, and there \
         is none: `useradd --system postgres` (which `scripts/test` does)",
    );
    Some((user.uid, user.gid))
}

/// Replication in the stack: whether Patroni keeps a synchronous standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_mode: true`: every commit waits for a synchronous standby, and only that
    /// standby may be promoted.
    Synchronous,
    /// `synchronous_mode: false`: commits do not wait; a standby within
    /// `maximum_lag_on_failover` of the lost leader may be promoted.
    Asynchronous,
}

/// A process of the stack; killed (SIGKILL) and reaped when dropped.
struct Daemon {
    child: Option<Child>,
}

impl Daemon {
    fn spawn(cmd: &mut Command, log: &Path, run_as: Option<(Uid, Gid)>) -> Self {
        let out = std::fs::File::create(log).expect("a log file");
        let err = out.try_clone().expect("a log file");
        if let Some((uid, gid)) = run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {:?}: {e}", cmd.get_program()));
        Self { child: Some(child) }
    }

    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Whether a process started here has exited (it is gone, or a zombie not yet reaped).
    fn exited(&self) -> bool {
        self.pid().is_some_and(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
        })
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One PostgreSQL node and the Patroni that runs it.
struct Node {
    name: String,
    dir: PathBuf,
    pg_port: u16,
    api_port: u16,
    patroni: Daemon,
    /// Between this node's Patroni and etcd.
    dcs_link: Proxy,
    /// What the other nodes replicate from (this node's `connect_address`).
    replication_link: Proxy,
}

impl Node {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The postmaster's process id, if a server runs in the node's data directory.
    fn postmaster(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        // After a crash the file outlives the server, and its number may have been reused.
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "postgres").then_some(pid)
    }

    fn api(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.api_port)
    }
}

/// The stack: etcd, three Patroni nodes, HAProxy. Dropping it stops every process by its id and
/// removes the scratch directory.
pub struct Patroni {
    nodes: Vec<Node>,
    haproxy: Daemon,
    haproxy_port: u16,
    etcd: Daemon,
    http: reqwest::Client,
    dir: tempfile::TempDir,
}

/// A node of the stack, by its index (`n0`, `n1`, `n2`).
pub type NodeId = usize;

impl Patroni {
    /// Starts etcd, three nodes under Patroni and HAProxy, waits until a leader and its standbys
    /// (a synchronous one, with [`Replication::Synchronous`]) are streaming and HAProxy reaches
    /// the leader, and creates the service's database.
    pub async fn start(replication: Replication) -> Self {
        let patroni = tool("patroni", "patroni");
        let etcd_bin = tool("etcd", "etcd-server");
        let haproxy_bin = tool("haproxy", "haproxy");
        let run_as = run_as();
        let dir = scratch();
        own(dir.path(), run_as);
        let etcd_port = free_port();
        let peer_port = free_port();
        let etcd = Daemon::spawn(
            Command::new(etcd_bin)
                .args(["--name", "e0", "--enable-v2=true", "--logger", "zap"])
                .args(["--log-level", "warn"])
                .arg("--data-dir")
                .arg(dir.path().join("etcd"))
                .args([
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{etcd_port}"),
                ])
                .args([
                    "--advertise-client-urls",
                    &format!("http://127.0.0.1:{etcd_port}"),
                ])
                .args([
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                ])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                ])
                .args([
                    "--initial-cluster",
                    &format!("e0=http://127.0.0.1:{peer_port}"),
                ])
                .current_dir(dir.path()),
            &dir.path().join("etcd.log"),
            run_as,
        );
        let mut this = Self {
            nodes: Vec::new(),
            haproxy: Daemon { child: None },
            haproxy_port: free_port(),
            etcd,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(1))
                .build()
                .expect("an HTTP client"),
            dir,
        };
        this.watchdog();
        this.wait_for(
            || async {
                this.get(&format!("http://127.0.0.1:{etcd_port}/version"))
                    .await
            },
            "etcd to answer",
        )
        .await;
        let etcd_addr = SocketAddr::from(([127, 0, 0, 1], etcd_port));
        for i in 0..3 {
            let node_dir = this.dir.path().join(format!("n{i}"));
            std::fs::create_dir(&node_dir).expect("a node directory");
            own(&node_dir, run_as);
            let pg_port = free_port();
            let dcs_link = Proxy::start(etcd_addr).await;
            let replication_link = Proxy::start(SocketAddr::from(([127, 0, 0, 1], pg_port))).await;
            let api_port = free_port();
            let config = node_config(
                i,
                &node_dir,
                replication,
                pg_port,
                api_port,
                dcs_link.addr(),
                replication_link.addr(),
            );
            let config_path = node_dir.join("patroni.yml");
            std::fs::write(&config_path, config).expect("writing patroni.yml");
            let daemon = Daemon::spawn(
                Command::new(&patroni)
                    .arg(&config_path)
                    .current_dir(&node_dir)
                    .env("HOME", &node_dir)
                    .env("LC_ALL", "C.UTF-8"),
                &node_dir.join("patroni.out"),
                run_as,
            );
            this.nodes.push(Node {
                name: format!("n{i}"),
                dir: node_dir,
                pg_port,
                api_port,
                patroni: daemon,
                dcs_link,
                replication_link,
            });
            // The first node bootstraps alone; the others copy it once it leads.
            if i == 0 {
                this.wait_for(|| this.role_is(0, "/primary"), "n0 to bootstrap and lead")
                    .await;
            }
            this.watchdog();
        }
        this.wait_for(|| this.standing(replication), "the standbys to stream")
            .await;
        this.start_haproxy(haproxy_bin, run_as);
        this.watchdog();
        this.wait_for(
            || this.routed_to_leader(),
            "HAProxy to reach the leader only",
        )
        .await;
        let mut conn = this.connect("postgres").await.expect("the leader");
        sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
            .execute(&mut conn)
            .await
            .expect("creating the service's database");
        this
    }

    fn start_haproxy(&mut self, bin: PathBuf, run_as: Option<(Uid, Gid)>) {
        let mut config = format!(
            "# Written by tests/faults/patroni.rs.\n\
             global\n    maxconn 400\n\
             defaults\n    mode tcp\n    timeout connect 1s\n    timeout client 1h\n    \
             timeout server 1h\n    timeout check 1s\n\
             listen postgres\n    bind 127.0.0.1:{port}\n    option httpchk GET /primary\n    \
             http-check expect status 200\n    \
             default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions\n",
            port = self.haproxy_port
        );
        for n in &self.nodes {
            writeln!(
                config,
                "    server {} 127.0.0.1:{} check port {}",
                n.name, n.pg_port, n.api_port
            )
            .unwrap();
        }
        let path = self.dir.path().join("haproxy.cfg");
        std::fs::write(&path, config).expect("writing haproxy.cfg");
        // `-db`: in the foreground, so that its process id is the one started here. In the
        // scratch directory: HAProxy goes back to where it started after reading its
        // configuration, and the unprivileged user may not enter the tests' own directory.
        self.haproxy = Daemon::spawn(
            Command::new(bin)
                .arg("-db")
                .arg("-f")
                .arg(&path)
                .current_dir(self.dir.path()),
            &self.dir.path().join("haproxy.log"),
            run_as,
        );
    }

    /// The scratch directory (the services' logs may go there too).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The service's database through HAProxy, as the services reach it.
    pub fn url(&self) -> String {
        tcp_url(SocketAddr::from(([127, 0, 0, 1], self.haproxy_port)))
    }

    /// A node's name, as Patroni knows it.
    pub fn name(&self, node: NodeId) -> &str {
        &self.nodes[node].name
    }

    async fn connect(&self, database: &str) -> Option<sqlx::PgConnection> {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/{database}",
            self.haproxy_port
        );
        let conn = tokio::time::timeout(Duration::from_secs(2), sqlx::PgConnection::connect(&url));
        let mut conn = conn.await.ok()?.ok()?;
        let primary: bool = sqlx::query_scalar("SELECT NOT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        primary.then_some(conn)
    }

    /// Whether HAProxy sends every new connection to the leader: one for each node in a row,
    /// since it balances over every node it deems up, and deems each up until its checks fail.
    async fn routed_to_leader(&self) -> bool {
        for _ in 0..self.nodes.len() * 2 {
            if self.connect("postgres").await.is_none() {
                return false;
            }
        }
        true
    }

    /// One value of a query on the service's database, on the leader through HAProxy; retried
    /// for a while, since the leader may be changing.
    pub async fn scalar(&self, sql: &str) -> i64 {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(mut conn) = self.connect(DATABASE).await {
                if let Ok(v) = sqlx::query_scalar(sql).fetch_one(&mut conn).await {
                    return v;
                }
            }
            assert!(Instant::now() < deadline, "no leader answered {sql}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn get(&self, url: &str) -> bool {
        let answer = self.http.get(url).send().await;
        answer.is_ok_and(|r| r.status() == StatusCode::OK)
    }

    /// Whether Patroni's REST API of `node` answers 200 to `path` (`/primary`, `/sync`,
    /// `/replica`): its health checks, which HAProxy uses too.
    async fn role_is(&self, node: NodeId, path: &str) -> bool {
        self.get(&self.nodes[node].api(path)).await
    }

    /// The node Patroni's REST API calls the primary, if exactly one does.
    pub async fn leader(&self) -> Option<NodeId> {
        let asked = (0..self.nodes.len()).map(|i| self.role_is(i, "/primary"));
        let answers = futures_util::future::join_all(asked).await;
        let leaders: Vec<NodeId> = (0..answers.len()).filter(|&i| answers[i]).collect();
        (leaders.len() == 1).then(|| leaders[0])
    }

    /// The synchronous standby, if there is one.
    pub async fn sync_standby(&self) -> Option<NodeId> {
        let asked = (0..self.nodes.len()).map(|i| self.role_is(i, "/sync"));
        let answers = futures_util::future::join_all(asked).await;
        (0..answers.len()).find(|&i| answers[i])
    }

    /// Whether there is a leader, the two other nodes stream from it, and with synchronous
    /// replication one of them is its synchronous standby.
    async fn standing(&self, replication: Replication) -> bool {
        let Some(leader) = self.leader().await else {
            return false;
        };
        for i in (0..self.nodes.len()).filter(|&i| i != leader) {
            if !self.role_is(i, "/replica").await {
                return false;
            }
        }
        replication == Replication::Asynchronous || self.sync_standby().await.is_some()
    }

    /// Waits until a leader, every standby streaming (a synchronous one among them, with
    /// synchronous replication) and HAProxy on the leader: the stack is whole again.
    pub async fn wait_until_whole(&self, replication: Replication) -> NodeId {
        self.wait_for(
            || self.standing(replication),
            "the cluster to be whole again",
        )
        .await;
        self.wait_for(
            || self.routed_to_leader(),
            "HAProxy to reach the leader only",
        )
        .await;
        self.leader().await.expect("a leader")
    }

    /// Waits until a node other than `old` leads; returns it.
    pub async fn wait_for_new_leader(&self, old: NodeId) -> NodeId {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(leader) = self.leader().await.filter(|&l| l != old) {
                return leader;
            }
            self.assert_before(
                deadline,
                &format!("a node other than {} to lead", self.name(old)),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_for<F, Fut>(&self, check: F, what: &str)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + STARTUP;
        while !check().await {
            self.assert_before(deadline, what);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Fails the test with the stack's logs if `deadline` has passed, or at once if a process of
    /// the stack has exited by itself (a configuration it refused, a port taken): no wait would
    /// bring it back.
    fn assert_before(&self, deadline: Instant, what: &str) {
        let died = [("etcd", &self.etcd), ("haproxy", &self.haproxy)]
            .into_iter()
            .chain(self.nodes.iter().map(|n| (n.name.as_str(), &n.patroni)))
            .find(|(_, d)| d.exited())
            .map(|(name, _)| name);
        if Instant::now() < deadline && died.is_none() {
            return;
        }
        let mut logs = String::new();
        for name in ["etcd.log", "haproxy.log"]
            .into_iter()
            .map(PathBuf::from)
            .chain(self.nodes.iter().flat_map(|n| {
                ["patroni.out", "patroni.log"].map(|f| PathBuf::from(&n.name).join(f))
            }))
        {
            let text = std::fs::read_to_string(self.dir.path().join(&name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            writeln!(
                logs,
                "--- {} (last lines)\n{}",
                name.display(),
                tail.join("\n")
            )
            .unwrap();
        }
        match died {
            Some(name) => panic!("{name} exited while waiting for {what}\n{logs}"),
            None => panic!("timed out after {STARTUP:?} waiting for {what}\n{logs}"),
        }
    }

    /// SIGKILL to `node`'s postmaster (its Patroni goes on, and restarts or replaces it).
    pub fn kill_postmaster(&self, node: NodeId) {
        let pm = self.nodes[node].postmaster().expect("a running postmaster");
        kill(Pid::from_raw(pm), Signal::SIGKILL).expect("killing the postmaster");
    }

    /// SIGSTOP to every PostgreSQL process of `node` (its Patroni goes on): the server freezes
    /// with what it has in flight. Returns the postmaster, for [`thaw`](Self::thaw).
    pub fn freeze(&self, node: NodeId) -> i32 {
        let pm = self.nodes[node].postmaster().expect("a running postmaster");
        signal_server(pm, Signal::SIGSTOP);
        pm
    }

    /// SIGCONT to the processes [`freeze`](Self::freeze) stopped.
    pub fn thaw(&self, postmaster: i32) {
        signal_server(postmaster, Signal::SIGCONT);
    }

    /// Holds every byte between `node`'s Patroni and etcd, both ways: the node is cut off from
    /// the consensus store, and its clients still reach it.
    pub fn cut_from_dcs(&self, node: NodeId) {
        self.nodes[node].dcs_link.stall();
    }

    /// Ends [`cut_from_dcs`](Self::cut_from_dcs); the requests it held are dropped, as a
    /// partition's would have timed out.
    pub fn reconnect_dcs(&self, node: NodeId) {
        let link = &self.nodes[node].dcs_link;
        link.cut();
        link.resume();
    }

    /// Holds the WAL the other nodes stream from `node`: they fall behind it.
    pub fn stall_replication_from(&self, node: NodeId) {
        self.nodes[node].replication_link.stall();
    }

    /// The machine of `node` dies: SIGKILL to its Patroni and its postmaster (whose other
    /// processes follow it). Nothing restarts them.
    pub fn crash(&mut self, node: NodeId) {
        let pm = self.nodes[node].postmaster();
        self.nodes[node].patroni.kill();
        if let Some(pm) = pm {
            kill(Pid::from_raw(pm), Signal::SIGKILL).ok();
        }
    }

    /// A planned `patronictl switchover` from `leader` to `candidate`; returns once patronictl
    /// has.
    pub fn switchover(&self, leader: NodeId, candidate: NodeId) {
        let config = self.nodes[leader].dir.join("patroni.yml");
        let out = blocking(|| {
            Command::new(tool("patronictl", "patroni"))
                .arg("-c")
                .arg(&config)
                .args(["switchover", "--force", "--leader", self.name(leader)])
                .args(["--candidate", self.name(candidate)])
                .env("HOME", self.dir.path())
                .output()
                .expect("running patronictl")
        });
        assert!(
            out.status.success(),
            "patronictl switchover failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A detached shell that stops every process of the stack and removes the scratch
    /// directory once the test process has exited, however it exits: what [`Drop`] does, for
    /// when it cannot. Started again whenever a process is added, with the ids known then.
    fn watchdog(&self) {
        let dir = self.dir.path().display().to_string();
        let daemons: Vec<String> = [&self.etcd, &self.haproxy]
            .into_iter()
            .chain(self.nodes.iter().map(|n| &n.patroni))
            .filter_map(Daemon::pid)
            .map(|p| p.to_string())
            .collect();
        let generation = daemons.len();
        let script = format!(
            "while kill -0 {me} 2>/dev/null && [ -e '{dir}/watchdog.{generation}' ]; do sleep 0.5; done; \
             [ -e '{dir}/watchdog.{generation}' ] || exit 0; \
             for p in {daemons}; do kill -KILL $p 2>/dev/null; done; \
             for f in '{dir}'/n*/data/postmaster.pid; do \
               pm=$(head -n 1 \"$f\" 2>/dev/null); \
               [ -n \"$pm\" ] && [ \"$(cat /proc/$pm/comm 2>/dev/null)\" = postgres ] || continue; \
               kill -CONT $pm $(cat /proc/$pm/task/*/children 2>/dev/null) 2>/dev/null; \
               kill -KILL $pm $(cat /proc/$pm/task/*/children 2>/dev/null) 2>/dev/null; \
             done; \
             rm -rf '{dir}'",
            me = std::process::id(),
            daemons = daemons.join(" "),
        );
        // The previous watchdog's marker goes: it exits, and this one takes over.
        for old in 0..generation {
            std::fs::remove_file(self.dir.path().join(format!("watchdog.{old}"))).ok();
        }
        std::fs::write(self.dir.path().join(format!("watchdog.{generation}")), "")
            .expect("the watchdog's marker");
        detached_watchdog(&script, "the stack's watchdog");
    }
}

impl Drop for Patroni {
    fn drop(&mut self) {
        // Patroni first, so that none restarts a server; then the servers, thawed so that
        // a frozen one takes its signal; then HAProxy and etcd. The directory goes last.
        for n in &mut self.nodes {
            n.patroni.kill();
        }
        for n in &self.nodes {
            if let Some(pm) = n.postmaster() {
                try_signal_server(pm, Signal::SIGCONT).ok();
                let children = children_of(pm);
                kill(Pid::from_raw(pm), Signal::SIGKILL).ok();
                for c in children {
                    kill(Pid::from_raw(c), Signal::SIGKILL).ok();
                }
            }
        }
        self.haproxy.kill();
        self.etcd.kill();
        for n in &self.nodes {
            n.dcs_link.cut();
            n.replication_link.cut();
        }
    }
}

/// Gives `path` to the user the stack runs as, alone.
fn own(path: &Path, run_as: Option<(Uid, Gid)>) {
    use std::os::unix::fs::PermissionsExt;
    if let Some((uid, gid)) = run_as {
        nix::unistd::chown(path, Some(uid), Some(gid)).expect("changing the owner");
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .expect("setting the mode");
}

/// Patroni's configuration of node `i`: its name, REST API, etcd (through its link), the
/// cluster-wide settings it bootstraps with (timings, replication mode), and its PostgreSQL.
fn node_config(
    i: usize,
    dir: &Path,
    replication: Replication,
    pg_port: u16,
    api_port: u16,
    dcs: SocketAddr,
    replication_link: SocketAddr,
) -> String {
    let dir = dir.display();
    let bin = snapfence::embedded::find_binaries().expect("PostgreSQL's binaries");
    let synchronous = replication == Replication::Synchronous;
    // Asynchronously, a standby that a stalled link held back is still promoted: the lag that
    // makes the contrast is what this allows.
    let max_lag = if synchronous { 1 << 20 } else { 1 << 30 };
    format!(
        "scope: snapfence
namespace: /sf-faults/
name: n{i}
log:
  level: INFO
  dir: {dir}
restapi:
  listen: 127.0.0.1:{api_port}
  connect_address: 127.0.0.1:{api_port}
etcd:
  hosts: {dcs}
  protocol: http
  # The link is a proxy: no discovery of etcd's own addresses, which would go around it.
  use_proxies: true
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: {max_lag}
    synchronous_mode: {synchronous}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        # A crash here is a killed process: the kernel keeps what it wrote.
        fsync: 'off'
        wal_log_hints: 'on'
        max_connections: 100
        shared_buffers: 32MB
        wal_keep_size: 128MB
  initdb:
    - encoding: UTF8
    - locale: C
    - auth: trust
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: {replication_link}
  data_dir: {dir}/data
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
  parameters:
    unix_socket_directories: '{dir}'
watchdog:
  mode: off
",
        bin = bin.display(),
    )
}
