//! The history checker: given every operation the clients made (with the wall-clock times they
//! invoked it and saw it complete, and what they were told) and what the database holds at the
//! end, it lists every way the history breaks what snapfence promises. It knows nothing of how
//! the history was made, so it checks hand-made histories (its unit tests, in `checker_tests`)
//! as it checks recorded ones.
//!
//! Times are microseconds of the machine's wall clock, the clock the database decides expiry
//! by, so a lease's expiry and a client's observations compare directly. An operation took
//! effect, if at all, at one instant between its `invoked` and `completed` times. An
//! *indeterminate* operation (timeout, connection cut, `503`) may or may not have taken effect:
//! the checker accepts either, decided by what the end state and the audit log show, but
//! nothing else.
//!
//! A transaction (`POST /v1/txn`) is one operation on its fence's key whose puts are writes of
//! other keys: each is checked as a write fenced by the grants of the fence, and the end must
//! hold all of a transaction's puts or none.

mod audit;
mod leases;
mod reads;
mod writes;

use std::collections::{BTreeMap, HashSet};
use std::fmt;

/// Microseconds since the Unix epoch, on the wall clock.
pub type Micros = i64;

/// The reason of an [`Outcome::Indeterminate`] that was a `503 indeterminate` answer.
pub const INDETERMINATE: &str = "503 indeterminate";

/// The [`Outcome::Unexpected`] of an acquire refused `lease_held` with itself as the holder: its
/// own grant took effect (an earlier attempt of it), and its client was not told the token.
pub const UNREPORTED_GRANT: &str = "lease_held by the very lease this acquire was granted";

/// What a client asked for. Keys are given on the [`Op`].
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `POST /v1/leases/{key}`.
    Acquire {
        /// The lease's time to live.
        ttl_ms: i64,
    },
    /// `POST /v1/leases/{key}/renew`.
    Renew {
        /// The token renewed.
        token: i64,
        /// The new time to live.
        ttl_ms: i64,
    },
    /// `PUT /v1/snapshots/{key}`; `etag` names the body (each body of a history is unique).
    Put {
        /// The token presented.
        token: i64,
        /// The ETag of the body sent.
        etag: String,
    },
    /// `GET /v1/snapshots/{key}`.
    Get,
    /// `DELETE /v1/leases/{key}`.
    Release {
        /// The token released.
        token: i64,
    },
    /// `POST /v1/txn` with `Fencing-Key` the op's key: puts of keys in its namespace, all or
    /// nothing.
    Txn {
        /// The token presented.
        token: i64,
        /// The puts, in order, each of another key.
        puts: Vec<TxnPut>,
    },
}

/// One put of a transaction; `etag` names the body (each body of a history is unique).
#[derive(Debug, Clone, PartialEq)]
pub struct TxnPut {
    /// The key written.
    pub key: String,
    /// The ETag of the body sent.
    pub etag: String,
}

/// A snapshot version as the server shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Its number, from 1.
    pub version: i64,
    /// The token of the write that made it.
    pub token: i64,
    /// The ETag of its body.
    pub etag: String,
}

/// What an acknowledged call answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A grant with its token.
    Granted {
        /// The new token.
        token: i64,
    },
    /// A renewal, or a release, went through.
    Done,
    /// A write was accepted as this version.
    Written {
        /// The version number.
        version: i64,
    },
    /// A read saw this version, or no snapshot.
    Read(Option<Version>),
    /// A transaction committed; the version of each of its puts, in order.
    Committed {
        /// The versions.
        versions: Vec<i64>,
    },
}

/// How a call ended, as the client saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A 2xx answer.
    Ok(Answer),
    /// A 4xx answer with the contract's code; a refused write names its audit row.
    Refused {
        /// The problem's `code`.
        code: String,
        /// The `audit_id` of a refused write.
        audit_id: Option<i64>,
    },
    /// `503 unavailable`: the service says that nothing was changed, so nothing may have been.
    NoEffect,
    /// No answer that says what happened (a timeout, a cut connection, `503 indeterminate`): it
    /// may or may not have taken effect.
    Indeterminate(String),
    /// An answer the contract does not allow for this call (a `500`, an unknown status).
    Unexpected(String),
}

/// One operation of one client.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    /// Unique in the history; sent as the request's `x-request-id` (`op-{id}`), so the audit
    /// log names it.
    pub id: u64,
    /// Which client made it.
    pub client: usize,
    /// The key.
    pub key: String,
    /// The call.
    pub call: Call,
    /// When the client sent it.
    pub invoked: Micros,
    /// When the client had its answer, or gave up.
    pub completed: Micros,
    /// What it was told.
    pub outcome: Outcome,
}

impl Op {
    /// The `x-request-id` this operation is sent with.
    pub fn request_id(&self) -> String {
        format!("op-{}", self.id)
    }
}

/// One row of the rejections log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// The row id.
    pub id: i64,
    /// The refused request's `x-request-id`.
    pub request_id: Option<String>,
    /// The key.
    pub key: String,
    /// `stale_token` or `unknown_token`.
    pub reason: String,
    /// The token the write presented.
    pub presented_token: i64,
    /// `put`, `delete` or `txn`.
    pub operation: String,
    /// The key of the lease that fenced the write (the key itself unless another was named).
    pub fencing_key: String,
}

/// What the database holds once the history is over.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinalState {
    /// Every version of every key that has a snapshot, in version order. The service must keep
    /// all of them (`--keep-versions` above the number of writes), so that "superseded" can be
    /// told from "lost".
    pub versions: BTreeMap<String, Vec<Version>>,
    /// Every row of the rejections log.
    pub rejections: Vec<AuditRow>,
}

/// A promise of snapfence that a history can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Property {
    /// Accepted writes of a key have non-decreasing tokens in version order.
    TokenOrder,
    /// A key's versions are 1, 2, 3, ... with none missing.
    GaplessVersions,
    /// No write takes effect after a lease with a higher token on its key was acknowledged.
    WriteAfterNewerGrant,
    /// No two acknowledged leases of one key, with different tokens, are surely live at once.
    OverlappingLeases,
    /// No token is granted twice.
    TokenReissued,
    /// A grant invoked after another was acknowledged has a greater token (so tokens after a
    /// restart or failover exceed all before).
    TokenRegression,
    /// Every acknowledged write is present (current or superseded) at the end, as the version
    /// it was acknowledged as, and no read saw a version the end does not hold.
    LostWrite,
    /// Whatever the end holds or a read saw was written by a write that was acknowledged as
    /// that version, or is indeterminate; never by a refused one, never by no one.
    PhantomWrite,
    /// A read sees at least every write acknowledged before it was invoked.
    StaleRead,
    /// Every refused write has exactly one audit row, which describes it, and every audit row
    /// is a write that was refused or is indeterminate.
    AuditMismatch,
    /// A write is refused only when a newer grant or a release of its token could explain it.
    UnjustifiedRefusal,
    /// An indeterminate write took effect or was refused, not both.
    BothOutcomes,
    /// Every answer is one the contract allows for its call.
    UnexpectedAnswer,
    /// A write answered `503 unavailable` took no effect: it is not stored and not audited.
    HonestUnavailable,
    /// A write took effect at most once: no body is stored as two versions.
    DuplicateEffect,
    /// Every grant is known to the client that asked for it: no acquire is refused because of
    /// its own grant ([`UNREPORTED_GRANT`]).
    UnreportedGrant,
    /// A transaction took effect whole or not at all: the end holds all of its puts or none.
    PartialTransaction,
}

/// One broken promise, with the operations that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    /// Which promise.
    pub property: Property,
    /// What happened, naming operations by id.
    pub detail: String,
}

/// The checker's verdict and the history's figures.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every broken promise found; empty when the history holds.
    pub anomalies: Vec<Anomaly>,
    /// Operations in the history.
    pub ops: usize,
    /// Operations that were indeterminate.
    pub indeterminate: usize,
    /// Indeterminate writes that the end state shows took effect.
    pub indeterminate_took_effect: usize,
    /// Of those, the ones the service answered `503 indeterminate` itself.
    pub indeterminate_answers_took_effect: usize,
    /// Operations answered `503 unavailable` (none of which may have taken effect: see
    /// [`Property::HonestUnavailable`]).
    pub unavailable: usize,
    /// Writes refused (and audited).
    pub refused_writes: usize,
    /// Writes accepted.
    pub accepted_writes: usize,
    /// Leases granted.
    pub grants: usize,
    /// Transactions committed.
    pub committed_txns: usize,
    /// Transactions refused (and audited).
    pub refused_txns: usize,
}

impl Report {
    /// How many anomalies break `property`.
    pub fn count(&self, property: Property) -> usize {
        self.anomalies
            .iter()
            .filter(|a| a.property == property)
            .count()
    }

    /// The anomalies other than those of the given properties.
    pub fn except(&self, allowed: &[Property]) -> Vec<&Anomaly> {
        self.anomalies
            .iter()
            .filter(|a| !allowed.contains(&a.property))
            .collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} operations ({} grants, {} writes accepted, {} refused), {} answered 503 \
             unavailable, {} indeterminate ({} of them writes that took effect, {} of these \
             answered 503 indeterminate), {} transactions committed, {} refused, {} anomalies",
            self.ops,
            self.grants,
            self.accepted_writes,
            self.refused_writes,
            self.unavailable,
            self.indeterminate,
            self.indeterminate_took_effect,
            self.indeterminate_answers_took_effect,
            self.committed_txns,
            self.refused_txns,
            self.anomalies.len()
        )?;
        let mut by_kind: BTreeMap<Property, usize> = BTreeMap::new();
        for a in &self.anomalies {
            *by_kind.entry(a.property).or_default() += 1;
        }
        if !by_kind.is_empty() {
            write!(f, " {by_kind:?}")?;
        }
        Ok(())
    }
}

/// A write as the checker sees it once the end state has decided indeterminate ones.
struct Write<'a> {
    op: &'a Op,
    /// The key written (for a transaction's put, not the op's key, its fence).
    key: &'a str,
    token: i64,
    etag: &'a str,
    /// The version it is known to be: acknowledged, or found at the end.
    version: Option<i64>,
}

/// A write an operation asked for: a put, or one put of a transaction, with the version it was
/// acknowledged as, if it was.
struct Asked<'a> {
    key: &'a str,
    token: i64,
    etag: &'a str,
    acknowledged: Option<i64>,
}

/// The writes `op` asked for: none for a call that writes no snapshot.
fn asked(op: &Op) -> Vec<Asked<'_>> {
    match &op.call {
        Call::Put { token, etag } => vec![Asked {
            key: &op.key,
            token: *token,
            etag,
            acknowledged: match op.outcome {
                Outcome::Ok(Answer::Written { version }) => Some(version),
                _ => None,
            },
        }],
        Call::Txn { token, puts } => {
            let versions = match &op.outcome {
                Outcome::Ok(Answer::Committed { versions }) => Some(versions),
                _ => None,
            };
            puts.iter()
                .enumerate()
                .map(|(n, p)| Asked {
                    key: &p.key,
                    token: *token,
                    etag: &p.etag,
                    acknowledged: versions.and_then(|v| v.get(n).copied()),
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// The token a fenced write (a put or a transaction) presented.
fn fenced_token(call: &Call) -> Option<i64> {
    match call {
        Call::Put { token, .. } | Call::Txn { token, .. } => Some(*token),
        _ => None,
    }
}

/// Checks a history against the end state.
pub fn check(ops: &[Op], end: &FinalState) -> Report {
    let mut c = Checker {
        ops,
        end,
        anomalies: Vec::new(),
    };
    let effective = c.decide_writes();
    c.token_order_and_gaps();
    c.writes_after_newer_grants(&effective);
    c.overlapping_leases();
    c.token_uniqueness_and_order();
    c.reads();
    c.audit();
    c.refusals_justified();
    c.unexpected_answers();
    let puts = || ops.iter().filter(|o| matches!(o.call, Call::Put { .. }));
    let txns = || ops.iter().filter(|o| matches!(o.call, Call::Txn { .. }));
    Report {
        ops: ops.len(),
        indeterminate: ops
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Indeterminate(_)))
            .count(),
        indeterminate_took_effect: effective
            .iter()
            .filter(|w| matches!(w.op.outcome, Outcome::Indeterminate(_)))
            .count(),
        indeterminate_answers_took_effect: effective
            .iter()
            .filter(
                |w| matches!(&w.op.outcome, Outcome::Indeterminate(why) if why == INDETERMINATE),
            )
            .count(),
        unavailable: ops
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::NoEffect))
            .count(),
        refused_writes: puts()
            .filter(|o| matches!(o.outcome, Outcome::Refused { .. }))
            .count(),
        accepted_writes: puts()
            .filter(|o| matches!(o.outcome, Outcome::Ok(_)))
            .count(),
        grants: granted(ops).count(),
        committed_txns: txns()
            .filter(|o| matches!(o.outcome, Outcome::Ok(_)))
            .count(),
        refused_txns: txns()
            .filter(|o| matches!(o.outcome, Outcome::Refused { .. }))
            .count(),
        anomalies: c.anomalies,
    }
}

/// Acknowledged grants: (op, token).
fn granted(ops: &[Op]) -> impl Iterator<Item = (&Op, i64)> {
    ops.iter().filter_map(|o| match o.outcome {
        Outcome::Ok(Answer::Granted { token }) => Some((o, token)),
        _ => None,
    })
}

/// A history being checked: each module of the checker adds the anomalies of its promises.
struct Checker<'a> {
    ops: &'a [Op],
    end: &'a FinalState,
    anomalies: Vec<Anomaly>,
}

impl<'a> Checker<'a> {
    fn flag(&mut self, property: Property, detail: String) {
        self.anomalies.push(Anomaly { property, detail });
    }

    fn audited_ops(&self) -> HashSet<&'a str> {
        self.end
            .rejections
            .iter()
            .filter_map(|r| r.request_id.as_deref())
            .collect()
    }
}
