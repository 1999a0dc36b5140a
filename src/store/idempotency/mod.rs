//! The `idempotency_records` table and the gate every changing statement opens with;
//! `sql/remember.sql` stores the answer in the same statement, so it commits exactly with the
//! change.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{FromRow, PgPool, Row};

use super::engine::batch::Job;
use super::engine::rolled_back_race;
use super::engine::statement::{Batched, Column, column};
use super::{RequestContext, Result, StoreError};
use crate::domain::{IdempotencyKey, Key};

/// A changing call's Idempotency-Key, and what makes a request the same request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// The key the client sent.
    pub key: IdempotencyKey,
    /// SHA-256 of the request: the same key with another fingerprint is a reused key.
    pub fingerprint: [u8; 32],
    /// For a PUT, its head's fingerprint alone, for a refusal made before the body.
    pub head_fingerprint: Option<[u8; 32]>,
}

/// How the gate of a changing statement let it through.
#[derive(Debug, Clone, PartialEq)]
pub enum Gated<T> {
    /// The statement ran; `T` is what it did.
    Ran(T),
    /// Done before under this Idempotency-Key; `T` is what it did then. Nothing changed now.
    Replayed(T),
    /// The Idempotency-Key was used before for a different request; nothing changed.
    KeyReused,
    /// Another request with this Idempotency-Key is running; nothing changed.
    InProgress,
    /// The request's API key was revoked before the statement ran; nothing changed.
    Revoked,
}

impl<T> Gated<T> {
    /// The same gate with the outcome mapped.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Gated<U> {
        match self {
            Self::Ran(t) => Gated::Ran(f(t)),
            Self::Replayed(t) => Gated::Replayed(f(t)),
            Self::KeyReused => Gated::KeyReused,
            Self::InProgress => Gated::InProgress,
            Self::Revoked => Gated::Revoked,
        }
    }
}

/// A changing statement's answer, read as `T` only once known to be this operation's.
pub(crate) struct GatedRow<T> {
    gate: String,
    prior_fingerprint: Option<Vec<u8>>,
    answer: Box<RawValue>,
    answers: PhantomData<T>,
}

impl<'r, T> FromRow<'r, PgRow> for GatedRow<T> {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            gate: row.try_get("gate")?,
            prior_fingerprint: row.try_get("prior_fingerprint")?,
            answer: row.try_get::<Json<Box<RawValue>>, _>("answer")?.0,
            answers: PhantomData,
        })
    }
}

impl<T: DeserializeOwned> GatedRow<T> {
    pub(crate) fn ran(&self) -> Result<Option<T>> {
        if self.gate == "run" {
            read(&self.answer).map(Some)
        } else {
            Ok(None)
        }
    }

    pub(crate) fn into_gated(self, ctx: &RequestContext) -> Result<Gated<T>> {
        Ok(match self.gate.as_str() {
            "run" => Gated::Ran(read(&self.answer)?),
            "replay" => {
                let prior = self.prior_fingerprint.as_deref();
                let same = ctx.idempotency.as_ref().is_some_and(|i| {
                    prior == Some(&i.fingerprint[..])
                        || i.head_fingerprint.is_some_and(|h| prior == Some(&h[..]))
                });
                if same {
                    Gated::Replayed(read(&self.answer)?)
                } else {
                    Gated::KeyReused
                }
            }
            "in_progress" => Gated::InProgress,
            "revoked" => Gated::Revoked,
            other => unreachable!("gate.sql's verdicts do not include {other:?}"),
        })
    }
}

fn read<T: DeserializeOwned>(answer: &RawValue) -> Result<T> {
    serde_json::from_str(answer.get())
        .map_err(|e| StoreError::Internal(sqlx::Error::Decode(Box::new(e))))
}

pub(crate) trait Change {
    fn key(&self) -> &Key;
    fn ctx(&self) -> &RequestContext;
}

pub(crate) fn changing<J: Change>(
    columns: impl IntoIterator<Item = Column<J>>,
    derived: &[(&'static str, &'static str)],
    parts: &[&'static str],
) -> Batched<J> {
    let mut b = Batched::builder(gate_columns().into_iter().chain(columns));
    for (name, sql) in derived {
        b = b.derive(name, sql);
    }
    b = b.part(include_str!("sql/gate.sql"));
    for part in parts {
        b = b.part(part);
    }
    b.part(include_str!("sql/remember.sql")).build()
}

fn gate_columns<J: Change>() -> [Column<J>; 4] {
    [
        column!(
            J,
            "idem" = |j| j.ctx().idempotency.as_ref().map(|i| i.key.as_str())
        ),
        column!(
            J,
            "fp" = |j| j.ctx().idempotency.as_ref().map(|i| &i.fingerprint[..])
        ),
        column!(J, "principal" = |j| j.ctx().principal.as_deref()),
        column!(J, "key_id" = |j| j.ctx().key_id),
    ]
}

impl<J: Change> Job for J {
    fn key(&self) -> &Key {
        Change::key(self)
    }

    fn claims(&self) -> Vec<String> {
        let mut claims = vec![format!("key\0{}", Change::key(self).as_str())];
        claims.extend(claim(self.ctx()));
        claims
    }
}

pub(crate) fn claim(ctx: &RequestContext) -> Option<String> {
    ctx.idempotency.as_ref().map(|i| {
        format!(
            "idempotency\0{}\0{}",
            ctx.principal.as_deref().unwrap_or(""),
            i.key.as_str()
        )
    })
}

/// Runs a changing statement until no race for its record rolls it back, and reads its gate.
pub(crate) async fn gated<T: DeserializeOwned, F, Fut>(
    ctx: &RequestContext,
    mut run: F,
) -> Result<Gated<T>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<GatedRow<T>>>,
{
    loop {
        match run().await {
            Err(e) if rolled_back_race(&e) => continue,
            row => return row?.into_gated(ctx),
        }
    }
}

/// Deletes up to `batch` records older than `retention`; how many.
pub async fn prune(pool: &PgPool, retention: Duration, batch: i64) -> Result<u64> {
    let sql = include_str!("sql/prune.sql");
    super::engine::delete_batch(pool, sql, retention, batch).await
}
