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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// Microseconds since the Unix epoch, on the wall clock.
pub type Micros = i64;

/// The reason of an [`Outcome::Indeterminate`] that was a `503 unavailable` answer.
pub const UNAVAILABLE: &str = "503 unavailable";

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
    /// No answer that says what happened (a timeout, a cut connection, `503`): it may or may
    /// not have taken effect.
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
    /// Of those, the ones answered `503 unavailable` (the contract says a 503 changed nothing;
    /// an answer lost after the commit makes that untrue, and this counts how often).
    pub unavailable_took_effect: usize,
    /// Writes refused (and audited).
    pub refused_writes: usize,
    /// Writes accepted.
    pub accepted_writes: usize,
    /// Leases granted.
    pub grants: usize,
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
            "{} operations ({} grants, {} writes accepted, {} refused), {} indeterminate ({} of \
             them writes that took effect, {} of these answered 503), {} anomalies",
            self.ops,
            self.grants,
            self.accepted_writes,
            self.refused_writes,
            self.indeterminate,
            self.indeterminate_took_effect,
            self.unavailable_took_effect,
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
    token: i64,
    etag: &'a str,
    /// The version it is known to be: acknowledged, or found at the end.
    version: Option<i64>,
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
        unavailable_took_effect: effective
            .iter()
            .filter(|w| matches!(&w.op.outcome, Outcome::Indeterminate(why) if why == UNAVAILABLE))
            .count(),
        refused_writes: puts()
            .filter(|o| matches!(o.outcome, Outcome::Refused { .. }))
            .count(),
        accepted_writes: puts()
            .filter(|o| matches!(o.outcome, Outcome::Ok(_)))
            .count(),
        grants: granted(ops).count(),
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

    /// Matches the end state's versions with the writes that made them, flags lost and phantom
    /// writes, and returns the writes that took effect (acknowledged, or indeterminate and
    /// found at the end).
    fn decide_writes(&mut self) -> Vec<Write<'a>> {
        let end = self.end;
        let mut stored: HashMap<(&str, &str), &Version> = HashMap::new();
        for (key, versions) in &end.versions {
            for v in versions {
                stored.insert((key.as_str(), v.etag.as_str()), v);
            }
        }
        let audited = self.audited_ops();
        let mut effective = Vec::new();
        let mut made: HashSet<(&str, &str)> = HashSet::new();
        for op in self.ops {
            let Call::Put { token, etag } = &op.call else {
                continue;
            };
            let found = stored.get(&(op.key.as_str(), etag.as_str())).copied();
            if found.is_some() {
                made.insert((op.key.as_str(), etag.as_str()));
            }
            match (&op.outcome, found) {
                (Outcome::Ok(Answer::Written { version }), Some(v)) => {
                    if v.version != *version || v.token != *token {
                        self.flag(
                            Property::LostWrite,
                            format!(
                                "op {} was acknowledged as version {version} with token {token} \
                                 of {:?}; the end holds its body as version {} with token {}",
                                op.id, op.key, v.version, v.token
                            ),
                        );
                    }
                    effective.push(Write {
                        op,
                        token: *token,
                        etag,
                        version: Some(*version),
                    });
                }
                (Outcome::Ok(Answer::Written { version }), None) => {
                    self.flag(
                        Property::LostWrite,
                        format!(
                            "op {} was acknowledged as version {version} of {:?} and is not there \
                             at the end",
                            op.id, op.key
                        ),
                    );
                    effective.push(Write {
                        op,
                        token: *token,
                        etag,
                        version: Some(*version),
                    });
                }
                (Outcome::Indeterminate(_), Some(v)) => {
                    if v.token != *token {
                        self.flag(
                            Property::PhantomWrite,
                            format!(
                                "op {} presented token {token} and its body is stored with token {}",
                                op.id, v.token
                            ),
                        );
                    }
                    if audited.contains(op.request_id().as_str()) {
                        self.flag(
                            Property::BothOutcomes,
                            format!(
                                "indeterminate op {} is stored as version {} of {:?} and also \
                                 audited as refused",
                                op.id, v.version, op.key
                            ),
                        );
                    }
                    effective.push(Write {
                        op,
                        token: *token,
                        etag,
                        version: Some(v.version),
                    });
                }
                (Outcome::Refused { code, .. }, Some(v)) => self.flag(
                    Property::PhantomWrite,
                    format!(
                        "op {} was refused ({code}) and is stored as version {} of {:?}",
                        op.id, v.version, op.key
                    ),
                ),
                _ => {}
            }
        }
        for (key, versions) in &end.versions {
            for v in versions {
                if !made.contains(&(key.as_str(), v.etag.as_str())) {
                    self.flag(
                        Property::PhantomWrite,
                        format!(
                            "version {} of {key:?} (token {}) was written by no operation of the \
                             history",
                            v.version, v.token
                        ),
                    );
                }
            }
        }
        effective
    }

    fn token_order_and_gaps(&mut self) {
        let end = self.end;
        for (key, versions) in &end.versions {
            for (i, v) in versions.iter().enumerate() {
                if v.version != i as i64 + 1 {
                    self.flag(
                        Property::GaplessVersions,
                        format!(
                            "{key:?}: the end holds version {} where {} belongs",
                            v.version,
                            i + 1
                        ),
                    );
                    break;
                }
            }
            for pair in versions.windows(2) {
                if pair[1].token < pair[0].token {
                    self.flag(
                        Property::TokenOrder,
                        format!(
                            "{key:?}: version {} has token {} after version {} with token {}",
                            pair[1].version, pair[1].token, pair[0].version, pair[0].token
                        ),
                    );
                }
            }
        }
    }

    /// A write that took effect after a grant with a higher token on its key was acknowledged
    /// was made with a token that was not the key's newest at any moment of its call.
    fn writes_after_newer_grants(&mut self, effective: &[Write<'_>]) {
        let mut grants: HashMap<&str, Vec<(Micros, i64, u64)>> = HashMap::new();
        for (op, token) in granted(self.ops) {
            grants
                .entry(op.key.as_str())
                .or_default()
                .push((op.completed, token, op.id));
        }
        // Per key, grants by acknowledgement time with the running maximum token.
        let mut newest: HashMap<&str, Vec<(Micros, i64, u64)>> = HashMap::new();
        for (key, mut list) in grants {
            list.sort();
            let mut best: Option<(i64, u64)> = None;
            let running = list
                .into_iter()
                .map(|(at, token, id)| {
                    if best.is_none_or(|(t, _)| token > t) {
                        best = Some((token, id));
                    }
                    let (t, id) = best.expect("set above");
                    (at, t, id)
                })
                .collect();
            newest.insert(key, running);
        }
        for w in effective {
            let Some(list) = newest.get(w.op.key.as_str()) else {
                continue;
            };
            let before = list.partition_point(|(at, _, _)| *at < w.op.invoked);
            if before == 0 {
                continue;
            }
            let (at, t, grant) = list[before - 1];
            if t > w.token {
                self.flag(
                    Property::WriteAfterNewerGrant,
                    format!(
                        "op {} wrote {:?} with token {} (version {:?}, etag {}) after op {grant} \
                         was granted token {t} at {at}",
                        w.op.id, w.op.key, w.token, w.version, w.etag
                    ),
                );
            }
        }
    }

    /// The span in which an acknowledged lease was surely live: from its grant's answer until
    /// the latest of its TTL counted from the grant's invocation and each acknowledged renewal's,
    /// cut short by the invocation of any release that may have taken effect.
    fn surely_live(&self) -> Vec<(&'a Op, i64, Micros, Micros)> {
        let mut spans = Vec::new();
        for (grant, token) in granted(self.ops) {
            let Call::Acquire { ttl_ms } = grant.call else {
                continue;
            };
            let mut until = grant.invoked + ttl_ms * 1000;
            for op in self.ops.iter().filter(|o| o.key == grant.key) {
                match (&op.call, &op.outcome) {
                    (Call::Renew { token: t, ttl_ms }, Outcome::Ok(_)) if *t == token => {
                        until = until.max(op.invoked + ttl_ms * 1000);
                    }
                    _ => {}
                }
            }
            for op in self.ops.iter().filter(|o| o.key == grant.key) {
                if let (Call::Release { token: t }, Outcome::Ok(_) | Outcome::Indeterminate(_)) =
                    (&op.call, &op.outcome)
                {
                    if *t == token {
                        until = until.min(op.invoked);
                    }
                }
            }
            if grant.completed < until {
                spans.push((grant, token, grant.completed, until));
            }
        }
        spans
    }

    fn overlapping_leases(&mut self) {
        let mut by_key: HashMap<&str, Vec<(&Op, i64, Micros, Micros)>> = HashMap::new();
        for span in self.surely_live() {
            by_key.entry(span.0.key.as_str()).or_default().push(span);
        }
        for (key, mut spans) in by_key {
            spans.sort_by_key(|s| s.2);
            // Against the span reaching furthest so far: any overlap shows with it.
            let mut reach: Option<(&Op, i64, Micros)> = None;
            for (op, token, from, until) in spans {
                if let Some((other, t, end)) = reach {
                    if from < end && t != token {
                        self.flag(
                            Property::OverlappingLeases,
                            format!(
                                "{key:?}: op {} holds token {token} from {from} while op {} still \
                                 surely holds token {t} until {end}",
                                op.id, other.id
                            ),
                        );
                    }
                }
                if reach.is_none_or(|(_, _, end)| until > end) {
                    reach = Some((op, token, until));
                }
            }
        }
    }

    fn token_uniqueness_and_order(&mut self) {
        let mut seen: HashMap<i64, u64> = HashMap::new();
        let grants: Vec<(&Op, i64)> = granted(self.ops).collect();
        for (op, token) in &grants {
            if let Some(first) = seen.insert(*token, op.id) {
                self.flag(
                    Property::TokenReissued,
                    format!(
                        "token {token} was granted by op {first} and again by op {}",
                        op.id
                    ),
                );
            }
        }
        let mut by_completion: Vec<&(&Op, i64)> = grants.iter().collect();
        by_completion.sort_by_key(|(op, _)| op.completed);
        let mut by_invocation: Vec<&(&Op, i64)> = grants.iter().collect();
        by_invocation.sort_by_key(|(op, _)| op.invoked);
        let mut done = 0;
        let mut highest: Option<(i64, u64)> = None;
        for (op, token) in by_invocation {
            while done < by_completion.len() && by_completion[done].0.completed < op.invoked {
                let (earlier, t) = by_completion[done];
                if highest.is_none_or(|(h, _)| *t > h) {
                    highest = Some((*t, earlier.id));
                }
                done += 1;
            }
            if let Some((h, earlier)) = highest {
                if *token <= h {
                    self.flag(
                        Property::TokenRegression,
                        format!(
                            "op {} was granted token {token}, not above token {h} that op \
                             {earlier} was granted before op {} was sent",
                            op.id, op.id
                        ),
                    );
                }
            }
        }
    }

    fn reads(&mut self) {
        let end = self.end;
        let mut writes: HashMap<(&str, &str), &Op> = HashMap::new();
        let mut acked: HashMap<&str, Vec<(Micros, i64, u64)>> = HashMap::new();
        for op in self.ops {
            if let Call::Put { etag, .. } = &op.call {
                writes.insert((op.key.as_str(), etag.as_str()), op);
                if let Outcome::Ok(Answer::Written { version }) = op.outcome {
                    acked
                        .entry(op.key.as_str())
                        .or_default()
                        .push((op.completed, version, op.id));
                }
            }
        }
        for op in self.ops {
            let (Call::Get, Outcome::Ok(Answer::Read(seen))) = (&op.call, &op.outcome) else {
                continue;
            };
            let seen_version = seen.as_ref().map_or(0, |v| v.version);
            if let Some(before) = acked.get(op.key.as_str()) {
                if let Some((_, v, w)) = before
                    .iter()
                    .filter(|(at, _, _)| *at < op.invoked)
                    .max_by_key(|(_, v, _)| *v)
                {
                    if *v > seen_version {
                        self.flag(
                            Property::StaleRead,
                            format!(
                                "op {} read version {seen_version} of {:?} after op {w} was \
                                 acknowledged as version {v}",
                                op.id, op.key
                            ),
                        );
                    }
                }
            }
            let Some(seen) = seen else { continue };
            match writes.get(&(op.key.as_str(), seen.etag.as_str())) {
                Some(w) => {
                    let consistent = match (&w.call, &w.outcome) {
                        (Call::Put { token, .. }, Outcome::Ok(Answer::Written { version })) => {
                            *token == seen.token && *version == seen.version
                        }
                        (Call::Put { token, .. }, Outcome::Indeterminate(_)) => {
                            *token == seen.token
                        }
                        _ => false,
                    };
                    if !consistent {
                        self.flag(
                            Property::PhantomWrite,
                            format!(
                                "op {} read version {} of {:?} (token {}), the body of op {} \
                                 whose outcome was {:?}",
                                op.id, seen.version, op.key, seen.token, w.id, w.outcome
                            ),
                        );
                    }
                }
                None => self.flag(
                    Property::PhantomWrite,
                    format!(
                        "op {} read version {} of {:?}, a body no operation wrote",
                        op.id, seen.version, op.key
                    ),
                ),
            }
            let kept = end
                .versions
                .get(&op.key)
                .and_then(|vs| vs.iter().find(|v| v.version == seen.version));
            if kept != Some(seen) {
                self.flag(
                    Property::LostWrite,
                    format!(
                        "op {} read version {} of {:?} (etag {}), which the end does not hold",
                        op.id, seen.version, op.key, seen.etag
                    ),
                );
            }
        }
    }

    fn audit(&mut self) {
        let by_id: HashMap<String, &Op> = self.ops.iter().map(|o| (o.request_id(), o)).collect();
        let mut rows: HashMap<&str, Vec<&AuditRow>> = HashMap::new();
        for row in &self.end.rejections {
            match row.request_id.as_deref() {
                Some(rid) if by_id.contains_key(rid) => rows.entry(rid).or_default().push(row),
                _ => self.flag(
                    Property::AuditMismatch,
                    format!(
                        "audit row {} ({:?}, token {}) names no operation of the history",
                        row.id, row.key, row.presented_token
                    ),
                ),
            }
        }
        for op in self.ops {
            let Call::Put { token, .. } = op.call else {
                continue;
            };
            let found = rows.get(op.request_id().as_str()).map_or(&[][..], |r| r);
            let describes = |row: &AuditRow| row.key == op.key && row.presented_token == token;
            match &op.outcome {
                Outcome::Refused {
                    code,
                    audit_id: Some(id),
                } if code == "stale_token" || code == "unknown_token" => {
                    let ok = found.len() == 1
                        && found[0].id == *id
                        && found[0].reason == *code
                        && describes(found[0]);
                    if !ok {
                        self.flag(
                            Property::AuditMismatch,
                            format!(
                                "op {} was refused ({code}, audit row {id}); its audit rows are \
                                 {found:?}",
                                op.id
                            ),
                        );
                    }
                }
                Outcome::Refused { code, audit_id } => self.flag(
                    Property::AuditMismatch,
                    format!(
                        "op {} was refused with {code} and audit row {audit_id:?}: a fenced write \
                         is refused as stale_token or unknown_token, with its audit row",
                        op.id
                    ),
                ),
                Outcome::Indeterminate(_) => {
                    if found.len() > 1 || found.iter().any(|r| !describes(r)) {
                        self.flag(
                            Property::AuditMismatch,
                            format!("indeterminate op {} has the audit rows {found:?}", op.id),
                        );
                    }
                }
                Outcome::Ok(_) | Outcome::Unexpected(_) => {
                    if !found.is_empty() {
                        self.flag(
                            Property::AuditMismatch,
                            format!(
                                "op {} ended {:?} and has the audit rows {found:?}",
                                op.id, op.outcome
                            ),
                        );
                    }
                }
            }
        }
    }

    /// A refusal must be explained: `stale_token` by a higher grant on the key or a release of
    /// the token that may have happened before the write completed; `unknown_token` only for a
    /// token that was not acknowledged as granted on this key (the clients present nothing else,
    /// so that is never expected).
    fn refusals_justified(&mut self) {
        let mut granted_on: HashMap<&str, Vec<(&Op, i64)>> = HashMap::new();
        for (op, token) in granted(self.ops) {
            granted_on
                .entry(op.key.as_str())
                .or_default()
                .push((op, token));
        }
        for op in self.ops {
            let (Call::Put { token, .. }, Outcome::Refused { code, .. }) = (&op.call, &op.outcome)
            else {
                continue;
            };
            let grants = granted_on.get(op.key.as_str()).map_or(&[][..], |g| g);
            let explained = match code.as_str() {
                "stale_token" => {
                    grants
                        .iter()
                        .any(|(g, t)| t > token && g.invoked < op.completed)
                        || self.ops.iter().any(|r| {
                            r.key == op.key
                                && r.invoked < op.completed
                                && matches!(r.call, Call::Release { token: t } if t == *token)
                                && !matches!(r.outcome, Outcome::Refused { .. })
                        })
                        // A grant that was indeterminate may have taken effect with a token
                        // no client learned.
                        || self.ops.iter().any(|a| {
                            a.key == op.key
                                && a.invoked < op.completed
                                && matches!(a.call, Call::Acquire { .. })
                                && matches!(a.outcome, Outcome::Indeterminate(_))
                        })
                }
                "unknown_token" => !grants.iter().any(|(_, t)| t == token),
                _ => true,
            };
            if !explained {
                self.flag(
                    Property::UnjustifiedRefusal,
                    format!(
                        "op {} presenting token {token} to {:?} was refused as {code} with nothing \
                         in the history to explain it",
                        op.id, op.key
                    ),
                );
            }
        }
    }

    fn unexpected_answers(&mut self) {
        for op in self.ops {
            if let Outcome::Unexpected(what) = &op.outcome {
                self.flag(
                    Property::UnexpectedAnswer,
                    format!("op {} ({:?} {:?}) answered {what}", op.id, op.call, op.key),
                );
            }
        }
    }
}
