//! `snapfence txn`: a transaction (v1.3) under one lease's fence, read as JSON or JSON lines.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use base64::Engine;
use clap::Args;
use serde::Deserialize;

use super::output::fields;
use super::snapshot::meta_fields;
use super::{Ctx, Exit, parse};
use crate::domain::{EntityTagCondition, FencingToken, Key, KeyPrefix, Metadata};
use snapfence_client::{TxnAnswer, TxnOp, TxnOpResult};

/// The arguments of `snapfence txn`.
#[derive(Debug, Args)]
pub struct TxnArgs {
    /// The lease whose namespace holds every key of the ops (the lease's key).
    #[arg(long, value_name = "KEY")]
    pub fence: Key,
    /// The token of that lease.
    #[arg(long, env = "SNAPFENCE_TOKEN", value_parser = parse::token)]
    pub token: FencingToken,
    /// Read the ops from this file [default: stdin]: `{"ops": [...]}`, a JSON array, or one op
    /// a line. An op is the contract's (`{"op": "put", "key": "k", "body": "<base64>"}`,
    /// `{"op": "delete", "key": "k"}`, `{"op": "delete_prefix", "prefix": "p/"}`); a put may
    /// give `text` (stored as sent) instead of `body`.
    #[arg(long, short)]
    pub file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum OpLine {
    Put {
        key: Key,
        #[serde(default)]
        body: Option<String>,
        #[serde(default)]
        text: Option<String>,
        #[serde(default)]
        content_type: Option<String>,
        #[serde(default)]
        metadata: Option<Metadata>,
        #[serde(default)]
        if_match: Option<String>,
        #[serde(default)]
        if_none_match: Option<String>,
    },
    Delete {
        key: Key,
    },
    DeletePrefix {
        prefix: KeyPrefix,
    },
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Document {
    Ops { ops: Vec<OpLine> },
    List(Vec<OpLine>),
}

/// Runs `snapfence txn`.
pub async fn main(ctx: &Ctx, args: TxnArgs) -> Exit {
    let ops = match read(args.file.as_ref()).and_then(|text| ops_of(&text)) {
        Ok(ops) => ops,
        Err(message) => {
            eprintln!("snapfence: {message}");
            return Exit::Usage;
        }
    };
    let check = format!(
        "Check whether it committed with `snapfence snapshot list --prefix {}/` before you retry",
        args.fence
    );
    match ctx.client.txn(&args.fence, args.token, &ops).await {
        Ok(answer) => {
            ctx.output.print(&answer, table);
            Exit::Success
        }
        Err(e) => ctx.fail(&e, Some(&check)),
    }
}

fn read(file: Option<&PathBuf>) -> Result<String, String> {
    match file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display())),
        None => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                eprintln!("snapfence: reading the ops from the terminal; end them with Ctrl-D");
            }
            let mut text = String::new();
            stdin
                .lock()
                .read_to_string(&mut text)
                .map_err(|e| format!("cannot read stdin: {e}"))?;
            Ok(text)
        }
    }
}

fn ops_of(text: &str) -> Result<Vec<TxnOp>, String> {
    let lines: Vec<OpLine> = match serde_json::from_str::<Document>(text) {
        Ok(Document::Ops { ops } | Document::List(ops)) => ops,
        Err(_) => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(n, l)| {
                serde_json::from_str(l).map_err(|e| format!("line {}: not an op ({e})", n + 1))
            })
            .collect::<Result<_, _>>()?,
    };
    if lines.is_empty() {
        return Err(
            "no ops given; send at least one, e.g. {\"op\": \"delete\", \"key\": \"k\"}".into(),
        );
    }
    lines
        .into_iter()
        .enumerate()
        .map(|(n, op)| op_of(op).map_err(|e| format!("op {n}: {e}")))
        .collect()
}

fn op_of(op: OpLine) -> Result<TxnOp, String> {
    Ok(match op {
        OpLine::Put {
            key,
            body,
            text,
            content_type,
            metadata,
            if_match,
            if_none_match,
        } => {
            let body = match (body, text) {
                (Some(b), None) => base64::engine::general_purpose::STANDARD
                    .decode(b.as_bytes())
                    .map_err(|e| format!("body is not base64 ({e}); give `text` for plain text"))?,
                (None, Some(t)) => t.into_bytes(),
                _ => return Err("a put gives `body` (base64) or `text`, one of them".into()),
            };
            let create_only = match if_none_match.as_deref() {
                None => false,
                Some("*") => true,
                Some(other) => return Err(format!("if_none_match is {other:?}; only \"*\"")),
            };
            TxnOp::Put {
                key,
                body: body.into(),
                content_type,
                metadata,
                if_match: if_match
                    .map(|m| EntityTagCondition::parse(&m))
                    .transpose()
                    .map_err(|e| format!("if_match: {e}"))?,
                create_only,
            }
        }
        OpLine::Delete { key } => TxnOp::Delete { key },
        OpLine::DeletePrefix { prefix } => TxnOp::DeletePrefix { prefix },
    })
}

fn table(answer: &TxnAnswer) -> String {
    let mut out = format!(
        "committed: {} ops under {} (token {})\n",
        answer.results.len(),
        answer.fencing_key,
        answer.token
    );
    for result in &answer.results {
        out.push('\n');
        out.push_str(&match result {
            TxnOpResult::Put { meta, created } => {
                let mut rows = meta_fields(meta);
                rows.push(("created", created.to_string()));
                fields(&rows)
            }
            TxnOpResult::Delete { key, deleted } => fields(&[
                ("deleted", key.to_string()),
                ("existed", deleted.to_string()),
            ]),
            TxnOpResult::DeletePrefix { prefix, deleted } => fields(&[
                ("deleted_prefix", prefix.clone()),
                ("count", deleted.to_string()),
            ]),
        });
    }
    out
}
