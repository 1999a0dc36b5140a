//! The audit log and the answers: one row per refused write, refusals justified, answers the
//! contract allows.

use std::collections::{HashMap, HashSet};

use super::*;

impl<'a> Checker<'a> {
    pub(super) fn audit(&mut self) {
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
            let Some(token) = fenced_token(&op.call) else {
                continue;
            };
            let found = rows.get(op.request_id().as_str()).map_or(&[][..], |r| r);
            // A put's row names its key; a transaction's, the first of its keys it was refused
            // on, beside its fence.
            let describes = |row: &AuditRow| {
                let (operation, key_ok) = match &op.call {
                    Call::Txn { puts, .. } => ("txn", puts.iter().any(|p| p.key == row.key)),
                    _ => ("put", row.key == op.key),
                };
                key_ok
                    && row.presented_token == token
                    && row.operation == operation
                    && row.fencing_key == op.key
            };
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
                Outcome::NoEffect => {
                    if !found.is_empty() {
                        self.flag(
                            Property::HonestUnavailable,
                            format!(
                                "op {} was answered 503 unavailable (nothing changed) and has the \
                                 audit rows {found:?}",
                                op.id
                            ),
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
    /// A refusal must be explained. `stale_token`: by rule (1), a release of the token on the
    /// write's fence (its key, or a transaction's fence); by either rule, a higher grant (or an
    /// indeterminate acquire) that may have happened before the write completed on its fence or
    /// on any other fence that writes one of its keys (rule (2) refuses a write below a key's
    /// highest written token, which only a higher grant on some fence of the key can make).
    /// `unknown_token`: only a token that was not acknowledged as granted on the write's fence
    /// (the clients present nothing else, so that is never expected).
    pub(super) fn refusals_justified(&mut self) {
        let mut granted_on: HashMap<&str, Vec<(&Op, i64)>> = HashMap::new();
        for (op, token) in granted(self.ops) {
            granted_on
                .entry(op.key.as_str())
                .or_default()
                .push((op, token));
        }
        // Every fence that some operation writes each key under.
        let mut fences_of: HashMap<String, HashSet<&str>> = HashMap::new();
        for op in self.ops {
            for w in asked(op) {
                fences_of
                    .entry(w.key.to_owned())
                    .or_default()
                    .insert(op.key.as_str());
            }
        }
        for op in self.ops {
            let (Some(token), Outcome::Refused { code, .. }) =
                (fenced_token(&op.call), &op.outcome)
            else {
                continue;
            };
            let grants = granted_on.get(op.key.as_str()).map_or(&[][..], |g| g);
            let explained = match code.as_str() {
                "stale_token" => {
                    let mut fences: HashSet<&str> = HashSet::from([op.key.as_str()]);
                    for w in asked(op) {
                        fences.extend(fences_of.get(w.key).into_iter().flatten());
                    }
                    let released = self.ops.iter().any(|r| {
                        r.key == op.key
                            && r.invoked < op.completed
                            && matches!(r.call, Call::Release { token: t } if t == token)
                            && !matches!(r.outcome, Outcome::Refused { .. } | Outcome::NoEffect)
                    });
                    let newer = fences.iter().any(|f| {
                        granted_on.get(f).is_some_and(|g| {
                            g.iter()
                                .any(|(g, t)| *t > token && g.invoked < op.completed)
                        })
                    });
                    // A grant that was indeterminate may have taken effect with a token no
                    // client learned.
                    let unknown_grant = self.ops.iter().any(|a| {
                        fences.contains(a.key.as_str())
                            && a.invoked < op.completed
                            && matches!(a.call, Call::Acquire { .. })
                            && matches!(a.outcome, Outcome::Indeterminate(_))
                    });
                    released || newer || unknown_grant
                }
                "unknown_token" => !grants.iter().any(|(_, t)| *t == token),
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
    pub(super) fn unexpected_answers(&mut self) {
        for op in self.ops {
            if let Outcome::Unexpected(what) = &op.outcome {
                let property = if what == UNREPORTED_GRANT {
                    Property::UnreportedGrant
                } else {
                    Property::UnexpectedAnswer
                };
                self.flag(
                    property,
                    format!("op {} ({:?} {:?}) answered {what}", op.id, op.call, op.key),
                );
            }
        }
    }
}
