//! The transaction clients' share of the workload: a holder of the lease on a namespace `ns-N`
//! commits transactions of two or three puts to keys `ns-N/K`, fenced by that lease
//! (`Fencing-Key: ns-N`). Every body is unique, so the checker finds each put at the end, or
//! not, by its ETag. The plain clients lease and put `ns-N/0` as well, under its own lease.

use base64::Engine as _;
use rand::Rng;
use rand::seq::IndexedRandom as _;
use serde_json::json;

use super::{Client, etag_of};
use crate::checker::{Call, Outcome, TxnPut};

/// How many namespaces the transaction clients share.
const NAMESPACES: usize = 2;

/// How many keys each namespace has: more than a transaction writes, so that transactions of
/// one namespace overlap in some keys and not others.
const KEYS_PER_NAMESPACE: usize = 4;

/// The namespaces' keys, the leases' keys.
pub(super) fn namespaces() -> Vec<String> {
    (0..NAMESPACES).map(|n| format!("ns-{n}")).collect()
}

/// The keys of namespace `ns` that transactions write.
pub(super) fn keys_of(ns: &str) -> Vec<String> {
    (0..KEYS_PER_NAMESPACE)
        .map(|k| format!("{ns}/{k}"))
        .collect()
}

/// One of the keys of namespace `ns`, at random.
pub(super) fn any_key_of(ns: &str) -> String {
    keys_of(ns)
        .choose(&mut rand::rng())
        .expect("a namespace has keys")
        .clone()
}

impl Client {
    /// Commits a transaction of two or three puts in the namespace `fence` with `token`.
    pub(super) async fn txn(&mut self, fence: &str, token: i64) -> Outcome {
        let id = self
            .recorder
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n = rand::rng().random_range(2..=3);
        let keys: Vec<String> = keys_of(fence)
            .choose_multiple(&mut rand::rng(), n)
            .cloned()
            .collect();
        let bodies: Vec<String> = (0..n)
            .map(|i| format!("client {} op {id} put {i}", self.id))
            .collect();
        let ops: Vec<_> = keys
            .iter()
            .zip(&bodies)
            .map(|(key, body)| {
                json!({
                    "op": "put",
                    "key": key,
                    "body": base64::engine::general_purpose::STANDARD.encode(body),
                })
            })
            .collect();
        let call = Call::Txn {
            token,
            puts: keys
                .iter()
                .zip(&bodies)
                .map(|(key, body)| TxnPut {
                    key: key.clone(),
                    etag: etag_of(body),
                })
                .collect(),
        };
        let body = json!({ "ops": ops }).to_string();
        self.record(id, fence, call, Some(body)).await
    }
}
