//! The writes: which took effect, their versions and tokens in order, none after a newer grant.

use std::collections::{HashMap, HashSet};

use super::*;

impl<'a> Checker<'a> {
    /// Matches the end state's versions with the writes that made them, flags lost and phantom
    /// writes, and returns the writes that took effect (acknowledged, or indeterminate and
    /// found at the end).
    pub(super) fn decide_writes(&mut self) -> Vec<Write<'a>> {
        let end = self.end;
        let mut stored: HashMap<(&str, &str), &Version> = HashMap::new();
        for (key, versions) in &end.versions {
            for v in versions {
                // Every body of a history is unique: one stored twice is a write done twice.
                if let Some(first) = stored.insert((key.as_str(), v.etag.as_str()), v) {
                    self.flag(
                        Property::DuplicateEffect,
                        format!(
                            "the body {} of {key:?} is stored twice, as versions {} and {}: one \
                             write took effect twice",
                            v.etag, first.version, v.version
                        ),
                    );
                }
            }
        }
        let audited = self.audited_ops();
        let mut effective = Vec::new();
        let mut made: HashSet<(&str, &str)> = HashSet::new();
        for op in self.ops {
            let writes = asked(op);
            let mut stored_of_op = 0;
            for w in &writes {
                let found = stored.get(&(w.key, w.etag)).copied();
                if found.is_some() {
                    made.insert((w.key, w.etag));
                    stored_of_op += 1;
                }
                let (token, key) = (w.token, w.key);
                match (&op.outcome, w.acknowledged, found) {
                    (_, Some(version), Some(v)) => {
                        if v.version != version || v.token != token {
                            self.flag(
                                Property::LostWrite,
                                format!(
                                    "op {} was acknowledged as version {version} with token \
                                     {token} of {key:?}; the end holds its body as version {} \
                                     with token {}",
                                    op.id, v.version, v.token
                                ),
                            );
                        }
                        effective.push(Write {
                            op,
                            key,
                            token,
                            etag: w.etag,
                            version: Some(version),
                        });
                    }
                    (_, Some(version), None) => {
                        self.flag(
                            Property::LostWrite,
                            format!(
                                "op {} was acknowledged as version {version} of {key:?} and is \
                                 not there at the end",
                                op.id
                            ),
                        );
                        effective.push(Write {
                            op,
                            key,
                            token,
                            etag: w.etag,
                            version: Some(version),
                        });
                    }
                    (Outcome::Indeterminate(_), None, Some(v)) => {
                        if v.token != token {
                            self.flag(
                                Property::PhantomWrite,
                                format!(
                                    "op {} presented token {token} and its body of {key:?} is \
                                     stored with token {}",
                                    op.id, v.token
                                ),
                            );
                        }
                        if audited.contains(op.request_id().as_str()) {
                            self.flag(
                                Property::BothOutcomes,
                                format!(
                                    "indeterminate op {} is stored as version {} of {key:?} and \
                                     also audited as refused",
                                    op.id, v.version
                                ),
                            );
                        }
                        effective.push(Write {
                            op,
                            key,
                            token,
                            etag: w.etag,
                            version: Some(v.version),
                        });
                    }
                    (Outcome::NoEffect, None, Some(v)) => self.flag(
                        Property::HonestUnavailable,
                        format!(
                            "op {} was answered 503 unavailable (nothing changed) and is stored \
                             as version {} of {key:?}",
                            op.id, v.version
                        ),
                    ),
                    (Outcome::Refused { code, .. }, None, Some(v)) => self.flag(
                        Property::PhantomWrite,
                        format!(
                            "op {} was refused ({code}) and is stored as version {} of {key:?}",
                            op.id, v.version
                        ),
                    ),
                    _ => {}
                }
            }
            if matches!(op.call, Call::Txn { .. })
                && stored_of_op > 0
                && stored_of_op < writes.len()
            {
                self.flag(
                    Property::PartialTransaction,
                    format!(
                        "transaction op {} ({:?}) left {stored_of_op} of its {} puts at the end",
                        op.id,
                        op.outcome,
                        writes.len()
                    ),
                );
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
    pub(super) fn token_order_and_gaps(&mut self) {
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
    /// A write that took effect after a grant with a higher token on its fence was acknowledged
    /// was made with a token that was not the fence's newest at any moment of its call.
    pub(super) fn writes_after_newer_grants(&mut self, effective: &[Write<'_>]) {
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
            // A write is fenced by the lease on the op's key: the key itself for a put, the
            // fence of a transaction.
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
                         was granted token {t} of its fence {:?} at {at}",
                        w.op.id, w.key, w.token, w.version, w.etag, w.op.key
                    ),
                );
            }
        }
    }
}
