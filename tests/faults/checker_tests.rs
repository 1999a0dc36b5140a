//! The checker on hand-made histories: one valid history that it passes, and for each promise a
//! history that breaks it, and only it. Times are in milliseconds here, written `ms(..)`.
//! [`txn`] does the same for transactions.

mod txn;

use crate::checker::{
    Answer, AuditRow, Call, FinalState, Micros, Op, Outcome, Property, Version, check,
};

fn ms(t: i64) -> Micros {
    t * 1000
}

/// A history under construction: each call appends one operation by client 0 on key `k`
/// unless said otherwise.
#[derive(Default)]
struct History {
    ops: Vec<Op>,
    end: FinalState,
}

impl History {
    fn op(&mut self, key: &str, call: Call, at: (i64, i64), outcome: Outcome) -> u64 {
        let id = self.ops.len() as u64;
        self.ops.push(Op {
            id,
            client: 0,
            key: key.into(),
            call,
            invoked: ms(at.0),
            completed: ms(at.1),
            outcome,
        });
        id
    }

    fn grant(&mut self, token: i64, at: (i64, i64), ttl_ms: i64) -> u64 {
        self.op(
            "k",
            Call::Acquire { ttl_ms },
            at,
            Outcome::Ok(Answer::Granted { token }),
        )
    }

    fn put(&mut self, token: i64, body: &str, at: (i64, i64), outcome: Outcome) -> u64 {
        self.op(
            "k",
            Call::Put {
                token,
                etag: body.into(),
            },
            at,
            outcome,
        )
    }

    fn written(&mut self, token: i64, body: &str, at: (i64, i64), version: i64) -> u64 {
        self.put(token, body, at, Outcome::Ok(Answer::Written { version }))
    }

    fn refused(&mut self, token: i64, body: &str, at: (i64, i64), audit_id: i64) -> u64 {
        let id = self.put(
            token,
            body,
            at,
            Outcome::Refused {
                code: "stale_token".into(),
                audit_id: Some(audit_id),
            },
        );
        self.audit_row(audit_id, id, token);
        id
    }

    fn audit_row(&mut self, audit_id: i64, op: u64, token: i64) {
        self.audit_row_of(audit_id, op, token, ("put", "k", "k"));
    }

    /// A `stale_token` row of `op` with its (operation, key, fencing key).
    fn audit_row_of(&mut self, audit_id: i64, op: u64, token: i64, what: (&str, &str, &str)) {
        let (operation, key, fencing_key) = what;
        self.end.rejections.push(AuditRow {
            id: audit_id,
            request_id: Some(format!("op-{op}")),
            key: key.into(),
            reason: "stale_token".into(),
            presented_token: token,
            operation: operation.into(),
            fencing_key: fencing_key.into(),
        });
    }

    fn read(&mut self, seen: Option<(i64, i64, &str)>, at: (i64, i64)) -> u64 {
        let seen = seen.map(|(version, token, etag)| Version {
            version,
            token,
            etag: etag.into(),
        });
        self.op("k", Call::Get, at, Outcome::Ok(Answer::Read(seen)))
    }

    /// The end holds these (version, token, body) of `k`.
    fn holds(&mut self, versions: &[(i64, i64, &str)]) {
        self.holds_of("k", versions);
    }

    /// The end holds these (version, token, body) of `key`.
    fn holds_of(&mut self, key: &str, versions: &[(i64, i64, &str)]) {
        self.end.versions.insert(
            key.into(),
            versions
                .iter()
                .map(|&(version, token, etag)| Version {
                    version,
                    token,
                    etag: etag.into(),
                })
                .collect(),
        );
    }

    /// The properties the checker finds broken, each once.
    fn broken(&self) -> Vec<Property> {
        let mut found: Vec<Property> = check(&self.ops, &self.end)
            .anomalies
            .iter()
            .map(|a| a.property)
            .collect();
        found.sort();
        found.dedup();
        found
    }
}

fn indeterminate() -> Outcome {
    Outcome::Indeterminate("timed out".into())
}

/// Two holders one after the other, each writing, the first refused once superseded, a read.
fn valid() -> History {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.written(1, "a", (10, 15), 1);
    h.op(
        "k",
        Call::Renew {
            token: 1,
            ttl_ms: 100,
        },
        (20, 25),
        Outcome::Ok(Answer::Done),
    );
    h.grant(2, (130, 135), 100);
    h.refused(1, "late", (140, 145), 7);
    h.written(2, "b", (150, 155), 2);
    h.read(Some((2, 2, "b")), (160, 165));
    h.op(
        "k",
        Call::Release { token: 2 },
        (170, 175),
        Outcome::Ok(Answer::Done),
    );
    h.holds(&[(1, 1, "a"), (2, 2, "b")]);
    h
}

#[test]
fn a_valid_history_has_no_anomalies() {
    let h = valid();
    let report = check(&h.ops, &h.end);
    assert!(report.anomalies.is_empty(), "{:#?}", report.anomalies);
    assert_eq!(
        (report.grants, report.accepted_writes, report.refused_writes),
        (2, 2, 1)
    );
}

#[test]
fn a_token_that_decreases_in_version_order_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.grant(2, (200, 205), 100);
    h.written(2, "b", (210, 215), 1);
    h.holds(&[(1, 2, "b"), (2, 1, "a")]);
    h.put(1, "a", (100, 300), indeterminate());
    assert!(
        h.broken().contains(&Property::TokenOrder),
        "{:?}",
        h.broken()
    );
}

#[test]
fn a_missing_version_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.written(1, "a", (10, 15), 1);
    h.written(1, "c", (20, 25), 3);
    h.holds(&[(1, 1, "a"), (3, 1, "c")]);
    assert_eq!(h.broken(), vec![Property::GaplessVersions]);
}

#[test]
fn a_write_accepted_after_a_newer_grant_was_acknowledged_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.grant(2, (110, 115), 100);
    h.written(1, "late", (120, 125), 1);
    h.holds(&[(1, 1, "late")]);
    assert_eq!(h.broken(), vec![Property::WriteAfterNewerGrant]);
}

#[test]
fn a_write_concurrent_with_a_newer_grant_may_be_accepted() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.grant(2, (110, 130), 100);
    h.written(1, "racing", (120, 125), 1);
    h.holds(&[(1, 1, "racing")]);
    assert_eq!(h.broken(), vec![]);
}

#[test]
fn two_leases_surely_live_at_once_are_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.grant(2, (50, 55), 100);
    assert_eq!(h.broken(), vec![Property::OverlappingLeases]);
}

#[test]
fn a_renewal_extends_the_span_a_lease_is_surely_live() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.op(
        "k",
        Call::Renew {
            token: 1,
            ttl_ms: 100,
        },
        (80, 85),
        Outcome::Ok(Answer::Done),
    );
    h.grant(2, (120, 125), 100);
    assert_eq!(h.broken(), vec![Property::OverlappingLeases]);
}

#[test]
fn a_release_ends_the_span_a_lease_is_surely_live() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.op("k", Call::Release { token: 1 }, (20, 40), indeterminate());
    h.grant(2, (30, 35), 100);
    assert_eq!(h.broken(), vec![]);
}

#[test]
fn a_token_granted_twice_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.op(
        "other",
        Call::Acquire { ttl_ms: 100 },
        (1, 4),
        Outcome::Ok(Answer::Granted { token: 1 }),
    );
    assert_eq!(h.broken(), vec![Property::TokenReissued]);
}

#[test]
fn a_token_below_one_granted_before_is_found() {
    let mut h = History::default();
    h.grant(5, (0, 5), 100);
    h.op(
        "other",
        Call::Acquire { ttl_ms: 100 },
        (10, 15),
        Outcome::Ok(Answer::Granted { token: 3 }),
    );
    assert_eq!(h.broken(), vec![Property::TokenRegression]);
}

#[test]
fn an_acknowledged_write_missing_at_the_end_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.written(1, "a", (10, 15), 1);
    h.written(1, "b", (20, 25), 2);
    h.holds(&[(1, 1, "a")]);
    assert_eq!(h.broken(), vec![Property::LostWrite]);
}

#[test]
fn an_acknowledged_version_holding_another_body_at_the_end_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.written(1, "a", (10, 15), 1);
    h.put(1, "b", (20, 25), indeterminate());
    h.holds(&[(1, 1, "b")]);
    let broken = h.broken();
    assert!(broken.contains(&Property::LostWrite), "{broken:?}");
}

#[test]
fn a_refused_write_found_at_the_end_is_found() {
    let mut h = valid();
    h.holds(&[(1, 1, "a"), (2, 2, "b"), (3, 1, "late")]);
    // Stored after token 2, it also breaks the token order.
    assert_eq!(
        h.broken(),
        vec![Property::TokenOrder, Property::PhantomWrite]
    );
}

#[test]
fn a_version_no_operation_wrote_is_found() {
    let mut h = valid();
    h.holds(&[(1, 1, "a"), (2, 2, "b"), (3, 2, "nobody")]);
    assert_eq!(h.broken(), vec![Property::PhantomWrite]);
}

#[test]
fn a_read_missing_an_acknowledged_write_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.written(1, "a", (10, 15), 1);
    h.read(None, (20, 25));
    h.holds(&[(1, 1, "a")]);
    assert_eq!(h.broken(), vec![Property::StaleRead]);
}

#[test]
fn a_read_of_a_version_the_end_does_not_hold_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.put(1, "a", (10, 15), indeterminate());
    h.read(Some((1, 1, "a")), (20, 25));
    assert_eq!(h.broken(), vec![Property::LostWrite]);
}

#[test]
fn a_refusal_without_its_audit_row_is_found() {
    let mut h = valid();
    h.end.rejections.clear();
    assert_eq!(h.broken(), vec![Property::AuditMismatch]);
}

#[test]
fn a_refusal_with_two_audit_rows_is_found() {
    let mut h = valid();
    h.audit_row(8, 4, 1);
    assert_eq!(h.broken(), vec![Property::AuditMismatch]);
}

#[test]
fn an_audit_row_of_an_accepted_write_is_found() {
    let mut h = valid();
    h.audit_row(8, 1, 1);
    assert_eq!(h.broken(), vec![Property::AuditMismatch]);
}

#[test]
fn a_stale_refusal_with_no_newer_grant_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.refused(1, "a", (10, 15), 1);
    assert_eq!(h.broken(), vec![Property::UnjustifiedRefusal]);
}

#[test]
fn an_indeterminate_write_may_have_taken_effect_or_not() {
    let mut took = History::default();
    took.grant(1, (0, 5), 100);
    took.put(1, "a", (10, 15), indeterminate());
    took.holds(&[(1, 1, "a")]);
    let report = check(&took.ops, &took.end);
    assert!(report.anomalies.is_empty(), "{:#?}", report.anomalies);
    assert_eq!(report.indeterminate_took_effect, 1);

    let mut lost = History::default();
    lost.grant(1, (0, 5), 100);
    lost.put(1, "a", (10, 15), indeterminate());
    assert_eq!(lost.broken(), vec![]);

    let mut audited = History::default();
    audited.grant(1, (0, 5), 100);
    audited.grant(2, (110, 115), 100);
    let op = audited.put(1, "a", (120, 125), indeterminate());
    audited.audit_row(1, op, 1);
    assert_eq!(audited.broken(), vec![]);
}

#[test]
fn an_indeterminate_write_both_stored_and_audited_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    let op = h.put(1, "a", (10, 15), indeterminate());
    h.audit_row(1, op, 1);
    h.holds(&[(1, 1, "a")]);
    assert_eq!(h.broken(), vec![Property::BothOutcomes]);
}

#[test]
fn an_indeterminate_write_that_took_effect_is_held_to_the_fencing_rule() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.grant(2, (110, 115), 100);
    h.put(1, "late", (120, 500), indeterminate());
    h.holds(&[(1, 1, "late")]);
    assert_eq!(h.broken(), vec![Property::WriteAfterNewerGrant]);
}

#[test]
fn an_internal_error_is_found() {
    let mut h = valid();
    h.op(
        "k",
        Call::Get,
        (200, 205),
        Outcome::Unexpected("500".into()),
    );
    assert_eq!(h.broken(), vec![Property::UnexpectedAnswer]);
}

#[test]
fn a_write_answered_unavailable_that_was_stored_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.written(1, "a", (10, 15), 1);
    h.put(1, "b", (20, 25), Outcome::NoEffect);
    h.holds(&[(1, 1, "a"), (2, 1, "b")]);
    assert_eq!(h.broken(), vec![Property::HonestUnavailable]);
}

#[test]
fn a_write_answered_unavailable_that_was_audited_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    h.grant(2, (110, 115), 100);
    let op = h.put(1, "late", (120, 125), Outcome::NoEffect);
    h.audit_row(7, op, 1);
    assert_eq!(h.broken(), vec![Property::HonestUnavailable]);
}

#[test]
fn a_write_answered_unavailable_that_left_nothing_holds() {
    let mut h = valid();
    h.put(2, "never", (300, 305), Outcome::NoEffect);
    let report = check(&h.ops, &h.end);
    assert!(report.anomalies.is_empty(), "{:#?}", report.anomalies);
    assert_eq!(report.unavailable, 1);
}

#[test]
fn a_release_answered_unavailable_explains_no_refusal() {
    let mut h = History::default();
    h.grant(1, (0, 5), 1000);
    h.op("k", Call::Release { token: 1 }, (10, 15), Outcome::NoEffect);
    h.refused(1, "a", (20, 25), 7);
    assert_eq!(h.broken(), vec![Property::UnjustifiedRefusal]);
}

#[test]
fn a_write_stored_twice_is_found() {
    let mut h = History::default();
    h.grant(1, (0, 5), 100);
    // Acknowledged as version 2 by a retry that ran again; its first attempt made version 1.
    h.written(1, "a", (10, 25), 2);
    h.holds(&[(1, 1, "a"), (2, 1, "a")]);
    assert!(
        h.broken().contains(&Property::DuplicateEffect),
        "{:?}",
        h.broken()
    );
}

#[test]
fn an_acquire_refused_by_its_own_grant_is_found() {
    let mut h = History::default();
    h.op(
        "k",
        Call::Acquire { ttl_ms: 100 },
        (0, 5),
        Outcome::Unexpected(crate::checker::UNREPORTED_GRANT.into()),
    );
    assert_eq!(h.broken(), vec![Property::UnreportedGrant]);
}
