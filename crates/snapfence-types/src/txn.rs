//! Transactions (contract v1.3, `POST /v1/txn`): an op as callers build it ([`TxnOp`]), as the
//! body carries it ([`TxnOpBody`]), and the answer; the one conversion each way, with the checks
//! of an op that need no database.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    ETag, EntityTagCondition, FencingToken, InvalidInput, Key, KeyPrefix, Metadata, SnapshotMeta,
    Version,
};

/// The content type stored when a put names none.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// One op of a transaction (v1.3 `POST /v1/txn`).
#[derive(Debug, Clone, PartialEq)]
pub enum TxnOp {
    /// Writes a version of `key`.
    Put {
        /// The key, in the fence's namespace.
        key: Key,
        /// The body.
        body: Bytes,
        /// Its content type; [`DEFAULT_CONTENT_TYPE`] when `None`.
        content_type: Option<String>,
        /// Stored with the version.
        metadata: Option<Metadata>,
        /// Only if the current ETag matches.
        if_match: Option<EntityTagCondition>,
        /// Only if the key has no current snapshot (`if_none_match: "*"`).
        create_only: bool,
    },
    /// Removes the current snapshot of `key`, if any.
    Delete {
        /// The key, in the fence's namespace.
        key: Key,
    },
    /// Removes every current snapshot under `prefix` (in the fence's namespace).
    DeletePrefix {
        /// The prefix.
        prefix: KeyPrefix,
    },
}

impl TxnOp {
    /// A put of `body` to `key`, with no precondition.
    pub fn put(key: Key, body: impl Into<Bytes>) -> Self {
        Self::Put {
            key,
            body: body.into(),
            content_type: None,
            metadata: None,
            if_match: None,
            create_only: false,
        }
    }
}

/// An op as the body encodes it.
impl From<&TxnOp> for TxnOpBody {
    fn from(op: &TxnOp) -> Self {
        match op {
            TxnOp::Put {
                key,
                body,
                content_type,
                metadata,
                if_match,
                create_only,
            } => Self::Put {
                key: key.clone(),
                body: STANDARD.encode(body),
                content_type: content_type.clone(),
                metadata: metadata.clone(),
                if_match: if_match.as_ref().map(ToString::to_string),
                if_none_match: create_only.then(|| "*".to_owned()),
            },
            TxnOp::Delete { key } => Self::Delete { key: key.clone() },
            TxnOp::DeletePrefix { prefix } => Self::DeletePrefix {
                prefix: prefix.clone(),
            },
        }
    }
}

/// An op as sent, checked: its body base64, its content type visible ASCII, `if_match` entity
/// tags, `if_none_match` only `*`, not both.
impl TryFrom<TxnOpBody> for TxnOp {
    type Error = InvalidInput;

    fn try_from(op: TxnOpBody) -> Result<Self, InvalidInput> {
        Ok(match op {
            TxnOpBody::Put {
                key,
                body,
                content_type,
                metadata,
                if_match,
                if_none_match,
            } => {
                let body = STANDARD
                    .decode(body.as_bytes())
                    .map_err(|e| InvalidInput::new(format!("body is not base64 ({e})")))?;
                if content_type.as_deref().is_some_and(|ct| {
                    ct.is_empty() || !ct.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
                }) {
                    return Err(InvalidInput::new(
                        "content_type must be visible ASCII, e.g. application/json",
                    ));
                }
                let if_match = if_match
                    .map(|m| EntityTagCondition::parse(&m))
                    .transpose()
                    .map_err(|e| InvalidInput::new(format!("if_match: {e}")))?;
                let create_only = match if_none_match.as_deref() {
                    None => false,
                    Some("*") => true,
                    Some(other) => {
                        return Err(InvalidInput::new(format!(
                            "if_none_match is {other:?}; only \"*\" (create only) is supported"
                        )));
                    }
                };
                if if_match.is_some() && create_only {
                    return Err(InvalidInput::new(
                        "send if_match or if_none_match, not both",
                    ));
                }
                Self::Put {
                    key,
                    body: Bytes::from(body),
                    content_type,
                    metadata,
                    if_match,
                    create_only,
                }
            }
            TxnOpBody::Delete { key } => Self::Delete { key },
            TxnOpBody::DeletePrefix { prefix } => Self::DeletePrefix { prefix },
        })
    }
}

/// One op of a transaction as `POST /v1/txn` takes it (v1.3); the server reads it with unknown
/// fields refused, and checks the rest (base64, preconditions, the namespace) itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum TxnOpBody {
    /// Writes a version of `key`.
    Put {
        /// The key.
        key: Key,
        /// The body, base64 (standard alphabet, padded).
        body: String,
        /// Its content type; `application/octet-stream` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content_type: Option<String>,
        /// Stored with the version.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<Metadata>,
        /// Only if the current ETag matches.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        if_match: Option<String>,
        /// `*`: only if the key has no current snapshot.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        if_none_match: Option<String>,
    },
    /// Removes the current snapshot of `key`, if any.
    Delete {
        /// The key.
        key: Key,
    },
    /// Removes every current snapshot under `prefix` in the fence's namespace.
    DeletePrefix {
        /// The prefix.
        prefix: KeyPrefix,
    },
}

/// Read from the fields present, in the order `untagged` would try the variants, but without
/// `untagged` and `flatten`, which buffer every field (a fifth of a client's time a transaction).
impl<'de> Deserialize<'de> for TxnOpResult {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            key: Option<Key>,
            version: Option<Version>,
            token: Option<FencingToken>,
            etag: Option<ETag>,
            size: Option<i64>,
            content_type: Option<String>,
            updated_at: Option<DateTime<Utc>>,
            fencing_key: Option<Key>,
            #[serde(default)]
            metadata: Option<Metadata>,
            created: Option<bool>,
            prefix: Option<String>,
            deleted: Option<Deleted>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Deleted {
            Found(bool),
            Count(u64),
        }
        let w = Wire::deserialize(d)?;
        match w {
            Wire {
                version: Some(version),
                token: Some(token),
                etag: Some(etag),
                size: Some(size),
                content_type: Some(content_type),
                updated_at: Some(updated_at),
                created: Some(created),
                key,
                fencing_key,
                metadata,
                ..
            } => Ok(Self::Put {
                meta: SnapshotMeta {
                    key,
                    version,
                    token,
                    etag,
                    size,
                    content_type,
                    updated_at,
                    fencing_key,
                    metadata,
                },
                created,
            }),
            Wire {
                prefix: Some(prefix),
                deleted: Some(Deleted::Count(deleted)),
                ..
            } => Ok(Self::DeletePrefix { prefix, deleted }),
            Wire {
                key: Some(key),
                deleted: Some(Deleted::Found(deleted)),
                ..
            } => Ok(Self::Delete { key, deleted }),
            _ => Err(serde::de::Error::custom(
                "an op's result is none of a put's, a delete's or a prefix delete's",
            )),
        }
    }
}

/// The body of `POST /v1/txn` (v1.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TxnBody {
    /// The ops, in order.
    pub ops: Vec<TxnOpBody>,
}

/// A committed transaction's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TxnAnswer {
    /// The token that fenced it.
    pub token: FencingToken,
    /// The lease whose namespace held its keys.
    pub fencing_key: Key,
    /// Each op's result, in order.
    pub results: Vec<TxnOpResult>,
}

/// What one op of a committed transaction did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TxnOpResult {
    /// A put: the version written, and whether it created the snapshot.
    Put {
        /// The version written.
        #[serde(flatten)]
        meta: SnapshotMeta,
        /// Whether the key had no current snapshot.
        created: bool,
    },
    /// A prefix delete: how many snapshots it removed.
    DeletePrefix {
        /// The prefix.
        prefix: String,
        /// How many.
        deleted: u64,
    },
    /// A delete: whether the key had a current snapshot.
    Delete {
        /// The key.
        key: Key,
        /// Whether it had one.
        deleted: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Key {
        Key::parse(k.to_owned()).unwrap()
    }

    #[test]
    fn every_op_result_reads_back_as_written() {
        let put = TxnOpResult::Put {
            meta: SnapshotMeta {
                key: Some(key("run/1/a")),
                version: Version::from_stored(3),
                token: FencingToken::new(7).unwrap(),
                etag: ETag::of(b"x"),
                size: 1,
                content_type: DEFAULT_CONTENT_TYPE.to_owned(),
                updated_at: "2026-12-07T10:00:00.123Z".parse().unwrap(),
                fencing_key: Some(key("run/1")),
                metadata: None,
            },
            created: false,
        };
        let delete = TxnOpResult::Delete {
            key: key("run/1/b"),
            deleted: true,
        };
        let prefix = TxnOpResult::DeletePrefix {
            prefix: "run/1/tmp/".to_owned(),
            deleted: 4,
        };
        for result in [put, delete, prefix] {
            let json = serde_json::to_string(&result).unwrap();
            let read: TxnOpResult = serde_json::from_str(&json).unwrap();
            assert_eq!(read, result, "{json}");
        }
    }

    #[test]
    fn an_op_result_of_no_known_shape_is_refused() {
        for json in [
            r#"{"key":"a"}"#,
            r#"{"prefix":"a/","deleted":true}"#,
            r#"{"version":1}"#,
        ] {
            assert!(serde_json::from_str::<TxnOpResult>(json).is_err(), "{json}");
        }
    }
}
