//! `snapfence txn`: a transaction (v1.3) under one lease's fence, read as JSON or JSON lines.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use clap::Args;
use serde::Deserialize;

use super::output::fields;
use super::snapshot::meta_fields;
use super::{Ctx, Exit, parse};
use crate::domain::{FencingToken, Key, TxnAnswer, TxnOp, TxnOpBody, TxnOpResult};

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

/// The whole-document forms of the input; an op is read in the contract's form
/// ([`TxnOpBody`]) once a `text` is turned into its `body`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Document {
    Ops { ops: Vec<serde_json::Value> },
    List(Vec<serde_json::Value>),
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
    let lines: Vec<serde_json::Value> = match serde_json::from_str::<Document>(text) {
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

fn op_of(mut op: serde_json::Value) -> Result<TxnOp, String> {
    if let Some(o) = op.as_object_mut() {
        if let Some(text) = o.remove("text") {
            if o.contains_key("body") {
                return Err("a put gives `body` (base64) or `text`, one of them".into());
            }
            let text = text.as_str().ok_or("`text` must be a string")?;
            o.insert("body".into(), STANDARD.encode(text).into());
        }
    }
    let op: TxnOpBody = serde_json::from_value(op).map_err(|e| e.to_string())?;
    TxnOp::try_from(op).map_err(|e| e.to_string())
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
