//! The checker on hand-made histories with transactions: a lease on `f` fences transactions
//! that put keys `f/a`, `f/b`, `f/c`.

use super::{History, indeterminate};
use crate::checker::{Answer, Call, Outcome, Property, TxnPut, check};

impl History {
    fn grant_f(&mut self, token: i64, at: (i64, i64)) -> u64 {
        self.op(
            "f",
            Call::Acquire { ttl_ms: 100 },
            at,
            Outcome::Ok(Answer::Granted { token }),
        )
    }

    /// A transaction under `f` of these (key, body) puts.
    fn txn(&mut self, token: i64, puts: &[(&str, &str)], at: (i64, i64), outcome: Outcome) -> u64 {
        let puts = puts
            .iter()
            .map(|&(key, etag)| TxnPut {
                key: key.into(),
                etag: etag.into(),
            })
            .collect();
        self.op("f", Call::Txn { token, puts }, at, outcome)
    }

    /// A transaction under `f` refused as stale, with its audit row naming its first key.
    fn refused_txn(&mut self, token: i64, puts: &[(&str, &str)], at: (i64, i64), audit_id: i64) {
        let refused = Outcome::Refused {
            code: "stale_token".into(),
            audit_id: Some(audit_id),
        };
        let op = self.txn(token, puts, at, refused);
        self.audit_row_of(audit_id, op, token, ("txn", puts[0].0, "f"));
    }
}

fn committed(versions: &[i64]) -> Outcome {
    Outcome::Ok(Answer::Committed {
        versions: versions.to_vec(),
    })
}

/// Two holders of `f` one after the other, each committing a transaction, the first refused
/// once superseded, and a read of a key they wrote.
fn valid() -> History {
    let mut h = History::default();
    h.grant_f(1, (0, 5));
    h.txn(
        1,
        &[("f/a", "a1"), ("f/b", "b1")],
        (10, 15),
        committed(&[1, 1]),
    );
    h.grant_f(2, (130, 135));
    h.refused_txn(1, &[("f/a", "late-a"), ("f/c", "late-c")], (140, 145), 7);
    h.txn(
        2,
        &[("f/a", "a2"), ("f/c", "c2")],
        (150, 155),
        committed(&[2, 1]),
    );
    h.op(
        "f/a",
        Call::Get,
        (160, 165),
        Outcome::Ok(Answer::Read(Some(crate::checker::Version {
            version: 2,
            token: 2,
            etag: "a2".into(),
        }))),
    );
    h.holds_of("f/a", &[(1, 1, "a1"), (2, 2, "a2")]);
    h.holds_of("f/b", &[(1, 1, "b1")]);
    h.holds_of("f/c", &[(1, 2, "c2")]);
    h
}

#[test]
fn a_valid_history_with_transactions_has_no_anomalies() {
    let h = valid();
    let report = check(&h.ops, &h.end);
    assert!(report.anomalies.is_empty(), "{:#?}", report.anomalies);
    assert_eq!((report.committed_txns, report.refused_txns), (2, 1));
}

#[test]
fn an_acknowledged_transaction_missing_one_put_at_the_end_is_found() {
    let mut h = valid();
    h.end.versions.remove("f/b");
    assert_eq!(
        h.broken(),
        vec![Property::LostWrite, Property::PartialTransaction]
    );
}

#[test]
fn an_indeterminate_transaction_may_have_taken_effect_whole_or_not_at_all() {
    let mut whole = History::default();
    whole.grant_f(1, (0, 5));
    whole.txn(1, &[("f/a", "a"), ("f/b", "b")], (10, 15), indeterminate());
    whole.holds_of("f/a", &[(1, 1, "a")]);
    whole.holds_of("f/b", &[(1, 1, "b")]);
    let report = check(&whole.ops, &whole.end);
    assert!(report.anomalies.is_empty(), "{:#?}", report.anomalies);
    assert_eq!(report.indeterminate_took_effect, 2);

    let mut none = History::default();
    none.grant_f(1, (0, 5));
    none.txn(1, &[("f/a", "a"), ("f/b", "b")], (10, 15), indeterminate());
    assert_eq!(none.broken(), vec![]);
}

#[test]
fn an_indeterminate_transaction_that_took_effect_in_part_is_found() {
    let mut h = History::default();
    h.grant_f(1, (0, 5));
    h.txn(1, &[("f/a", "a"), ("f/b", "b")], (10, 15), indeterminate());
    h.holds_of("f/a", &[(1, 1, "a")]);
    assert_eq!(h.broken(), vec![Property::PartialTransaction]);
}

#[test]
fn a_refused_transaction_whose_puts_are_stored_is_found() {
    let mut h = History::default();
    h.grant_f(1, (0, 5));
    h.grant_f(2, (130, 135));
    h.refused_txn(1, &[("f/a", "late-a"), ("f/c", "late-c")], (140, 145), 7);
    h.holds_of("f/a", &[(1, 1, "late-a")]);
    h.holds_of("f/c", &[(1, 1, "late-c")]);
    assert_eq!(h.broken(), vec![Property::PhantomWrite]);
}

#[test]
fn a_transaction_applied_twice_is_found() {
    let mut h = History::default();
    h.grant_f(1, (0, 5));
    // Acknowledged by a retry that ran again; its first attempt made the first versions.
    h.txn(
        1,
        &[("f/a", "a"), ("f/b", "b")],
        (10, 25),
        committed(&[2, 2]),
    );
    h.holds_of("f/a", &[(1, 1, "a"), (2, 1, "a")]);
    h.holds_of("f/b", &[(1, 1, "b"), (2, 1, "b")]);
    assert!(
        h.broken().contains(&Property::DuplicateEffect),
        "{:?}",
        h.broken()
    );
}

#[test]
fn a_transaction_accepted_after_a_newer_grant_on_its_fence_was_acknowledged_is_found() {
    let mut h = History::default();
    h.grant_f(1, (0, 5));
    h.grant_f(2, (130, 135));
    h.txn(
        1,
        &[("f/a", "a"), ("f/b", "b")],
        (140, 145),
        committed(&[1, 1]),
    );
    h.holds_of("f/a", &[(1, 1, "a")]);
    h.holds_of("f/b", &[(1, 1, "b")]);
    assert_eq!(h.broken(), vec![Property::WriteAfterNewerGrant]);
}

#[test]
fn a_refused_transaction_without_its_audit_row_is_found() {
    let mut h = valid();
    h.end.rejections.clear();
    assert_eq!(h.broken(), vec![Property::AuditMismatch]);
}

#[test]
fn a_refused_transactions_audit_row_naming_a_key_it_did_not_write_is_found() {
    let mut h = valid();
    h.end.rejections[0].key = "f/b".into();
    assert_eq!(h.broken(), vec![Property::AuditMismatch]);
}

#[test]
fn a_refused_transactions_audit_row_naming_another_fence_is_found() {
    let mut h = valid();
    h.end.rejections[0].fencing_key = "f/a".into();
    assert_eq!(h.broken(), vec![Property::AuditMismatch]);
}

#[test]
fn a_transaction_refused_with_no_newer_grant_on_its_fence_is_found() {
    let mut h = History::default();
    h.grant_f(1, (0, 5));
    h.refused_txn(1, &[("f/a", "a"), ("f/b", "b")], (10, 15), 7);
    assert_eq!(h.broken(), vec![Property::UnjustifiedRefusal]);
}

/// `f/a` under its own lease too: a grant on it and a put of it with `token`.
fn own_lease_of_f_a(h: &mut History, token: i64, at: i64, outcome: Outcome) -> u64 {
    h.op(
        "f/a",
        Call::Acquire { ttl_ms: 100 },
        (at, at + 5),
        Outcome::Ok(Answer::Granted { token }),
    );
    h.op(
        "f/a",
        Call::Put {
            token,
            etag: format!("own-{token}"),
        },
        (at + 10, at + 15),
        outcome,
    )
}

#[test]
fn a_transaction_refused_below_a_keys_token_written_under_its_own_lease_is_justified() {
    let mut h = History::default();
    h.grant_f(1, (0, 5));
    own_lease_of_f_a(&mut h, 2, 10, Outcome::Ok(Answer::Written { version: 1 }));
    h.refused_txn(1, &[("f/a", "a"), ("f/b", "b")], (30, 35), 7);
    h.holds_of("f/a", &[(1, 2, "own-2")]);
    assert_eq!(h.broken(), vec![]);
}

#[test]
fn a_put_refused_below_a_keys_token_written_by_a_transaction_is_justified() {
    let mut h = History::default();
    h.op(
        "f/a",
        Call::Acquire { ttl_ms: 100 },
        (0, 5),
        Outcome::Ok(Answer::Granted { token: 1 }),
    );
    h.grant_f(2, (20, 25));
    h.txn(
        2,
        &[("f/a", "a"), ("f/b", "b")],
        (30, 35),
        committed(&[1, 1]),
    );
    let refused = Outcome::Refused {
        code: "stale_token".into(),
        audit_id: Some(7),
    };
    let put = Call::Put {
        token: 1,
        etag: "late".into(),
    };
    let op = h.op("f/a", put, (40, 45), refused);
    h.audit_row_of(7, op, 1, ("put", "f/a", "f/a"));
    h.holds_of("f/a", &[(1, 2, "a")]);
    h.holds_of("f/b", &[(1, 2, "b")]);
    assert_eq!(h.broken(), vec![]);
}

#[test]
fn a_transaction_accepted_below_a_keys_token_written_under_its_own_lease_is_found() {
    let mut h = History::default();
    h.grant_f(1, (0, 5));
    own_lease_of_f_a(&mut h, 2, 10, Outcome::Ok(Answer::Written { version: 1 }));
    h.txn(
        1,
        &[("f/a", "a"), ("f/b", "b")],
        (30, 35),
        committed(&[2, 1]),
    );
    h.holds_of("f/a", &[(1, 2, "own-2"), (2, 1, "a")]);
    h.holds_of("f/b", &[(1, 1, "b")]);
    assert_eq!(h.broken(), vec![Property::TokenOrder]);
}
