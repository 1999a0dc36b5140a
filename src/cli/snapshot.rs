//! `snapfence snapshot …`: fenced writes and deletes, reads, and the retained versions.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use clap::Subcommand;

use super::lease::Fenced;
use super::output::{self, fields, time};
use super::{Ctx, Exit, parse};
use crate::domain::{
    Cursor, EntityTagCondition, Key, KeyPrefix, Metadata, PageLimit, SnapshotMeta, Version,
};
use snapfence_client::{ListOrder, PageRequest, PutOptions, SnapshotFilter, SnapshotHead, Written};

/// The snapshot subcommands.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Write a snapshot, fenced by a lease's token; the body comes from --file or stdin.
    Put {
        /// The key and the token of its lease.
        #[command(flatten)]
        fenced: Fenced,
        /// Read the body from this file [default: stdin].
        #[arg(long, short)]
        file: Option<PathBuf>,
        /// The content type to store [default: application/octet-stream].
        #[arg(long)]
        content_type: Option<String>,
        /// Write only if the current snapshot has this ETag (or `*`: only if there is one).
        #[arg(long, value_parser = parse::condition)]
        if_match: Option<EntityTagCondition>,
        /// Fence the write by the lease on this key, whose namespace holds KEY (KEY itself or
        /// keys under FENCE/) [default: KEY's own lease].
        #[arg(long, value_name = "FENCE")]
        fence: Option<Key>,
        /// Store this JSON object with the version, e.g. '{"step": 7}' (at most 4 KiB).
        #[arg(long, value_parser = parse::metadata)]
        metadata: Option<Metadata>,
    },
    /// Read a snapshot. The body goes to stdout, or to --out with its metadata on stdout.
    Get {
        /// The key.
        key: Key,
        /// Read this retained version instead of the current one.
        #[arg(long)]
        version: Option<Version>,
        /// Write the body to this file and print the metadata instead.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// List the retained versions, newest first.
    Versions {
        /// The key.
        key: Key,
        /// Versions per page (1..=1000) [default: 100].
        #[arg(long)]
        limit: Option<PageLimit>,
        /// The cursor a previous page printed.
        #[arg(long, value_parser = output::cursor)]
        cursor: Option<Cursor>,
    },
    /// List the keys that have a snapshot, in key order, each with its current version.
    List {
        /// Only keys starting with this.
        #[arg(long, value_parser = parse::prefix)]
        prefix: Option<KeyPrefix>,
        /// Byte order of the keys, or its reverse.
        #[arg(long, value_enum, default_value = "asc")]
        order: Order,
        /// Only keys after this one, in the order asked for.
        #[arg(long, value_name = "KEY")]
        start_after: Option<String>,
        /// Show each version's metadata too.
        #[arg(long)]
        metadata: bool,
        /// Keys per page (1..=1000) [default: 100].
        #[arg(long)]
        limit: Option<PageLimit>,
        /// The cursor a previous page printed.
        #[arg(long, value_parser = output::cursor)]
        cursor: Option<Cursor>,
    },
    /// Delete the snapshot and its versions, fenced by a lease's token.
    Delete {
        /// The key and the token of its lease.
        #[command(flatten)]
        fenced: Fenced,
        /// Delete only if the current snapshot has this ETag.
        #[arg(long, value_parser = parse::condition)]
        if_match: Option<EntityTagCondition>,
        /// Fence the delete by the lease on this key, whose namespace holds KEY
        /// [default: KEY's own lease].
        #[arg(long, value_name = "FENCE")]
        fence: Option<Key>,
    },
}

/// The order of `snapshot list`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Order {
    /// Byte order of the keys' UTF-8.
    Asc,
    /// Reversed.
    Desc,
}

/// Runs a snapshot subcommand.
pub async fn main(ctx: &Ctx, command: SnapshotCommand) -> Exit {
    match command {
        SnapshotCommand::Put {
            fenced: Fenced { key, token },
            file,
            content_type,
            if_match,
            fence,
            metadata,
        } => {
            let body = match read_body(file.as_ref()) {
                Ok(body) => body,
                Err(message) => {
                    eprintln!("snapfence: {message}");
                    return Exit::Failure;
                }
            };
            let options = PutOptions {
                content_type,
                if_match,
                fence,
                metadata,
            };
            let check = format!(
                "Check whether it was stored with `snapfence snapshot versions {key}` (look for token {token} and the body's ETag) before you retry"
            );
            match ctx.client.put_snapshot(&key, token, body, &options).await {
                Ok(written) => {
                    ctx.output.print(&written, written_table);
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, Some(&check)),
            }
        }
        SnapshotCommand::Get { key, version, out } => {
            let answer = match version {
                Some(v) => ctx.client.get_version(&key, v).await,
                None => ctx.client.get_snapshot(&key).await,
            };
            let snapshot = match answer {
                Ok(s) => s,
                Err(e) => return ctx.fail(&e, None),
            };
            let written = match &out {
                Some(path) => std::fs::write(path, &snapshot.body)
                    .map_err(|e| format!("cannot write {}: {e}", path.display())),
                None => std::io::stdout()
                    .lock()
                    .write_all(&snapshot.body)
                    .map_err(|e| format!("cannot write the body to stdout: {e}")),
            };
            if let Err(message) = written {
                eprintln!("snapfence: {message}");
                return Exit::Failure;
            }
            if out.is_some() {
                ctx.output.print(&snapshot.head, head_table);
            }
            Exit::Success
        }
        SnapshotCommand::Versions { key, limit, cursor } => {
            match ctx
                .client
                .list_versions(&key, &PageRequest { limit, cursor })
                .await
            {
                Ok(page) => {
                    ctx.output.print_page(
                        &page,
                        &[
                            "VERSION",
                            "TOKEN",
                            "SIZE",
                            "CONTENT_TYPE",
                            "UPDATED_AT",
                            "ETAG",
                        ],
                        |v: &SnapshotMeta| {
                            vec![
                                v.version.to_string(),
                                v.token.to_string(),
                                v.size.to_string(),
                                v.content_type.clone(),
                                time(&v.updated_at),
                                v.etag.to_string(),
                            ]
                        },
                    );
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, None),
            }
        }
        SnapshotCommand::List {
            prefix,
            order,
            start_after,
            metadata,
            limit,
            cursor,
        } => {
            let filter = SnapshotFilter {
                prefix,
                order: Some(match order {
                    Order::Asc => ListOrder::Asc,
                    Order::Desc => ListOrder::Desc,
                }),
                start_after,
                with_metadata: metadata,
                page: PageRequest { limit, cursor },
            };
            match ctx.client.list_snapshots(&filter).await {
                Ok(page) => {
                    let mut headers = vec![
                        "KEY",
                        "VERSION",
                        "TOKEN",
                        "SIZE",
                        "CONTENT_TYPE",
                        "UPDATED_AT",
                    ];
                    if metadata {
                        headers.push("METADATA");
                    }
                    ctx.output.print_page(&page, &headers, |m: &SnapshotMeta| {
                        let mut row = vec![
                            output::opt(m.key.as_ref()),
                            m.version.to_string(),
                            m.token.to_string(),
                            m.size.to_string(),
                            m.content_type.clone(),
                            time(&m.updated_at),
                        ];
                        if metadata {
                            row.push(
                                m.metadata
                                    .as_ref()
                                    .map_or_else(|| "-".to_owned(), |v| v.as_json().to_string()),
                            );
                        }
                        row
                    });
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, None),
            }
        }
        SnapshotCommand::Delete {
            fenced: Fenced { key, token },
            if_match,
            fence,
        } => {
            let check = format!(
                "Check with `snapfence snapshot get {key}` (not_found means it is gone) before you retry"
            );
            match ctx
                .client
                .delete_snapshot_under(&key, fence.as_ref(), token, if_match.as_ref())
                .await
            {
                Ok(()) => {
                    ctx.output.print_done(&key, token, "deleted");
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, Some(&check)),
            }
        }
    }
}

/// The whole body of a put: a retry must send the same bytes.
fn read_body(file: Option<&PathBuf>) -> Result<Vec<u8>, String> {
    match file {
        Some(path) => {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        }
        None => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                eprintln!("snapfence: reading the snapshot from the terminal; end it with Ctrl-D");
            }
            let mut body = Vec::new();
            stdin
                .lock()
                .read_to_end(&mut body)
                .map_err(|e| format!("cannot read stdin: {e}"))?;
            Ok(body)
        }
    }
}

pub(super) fn meta_fields(m: &SnapshotMeta) -> Vec<(&'static str, String)> {
    let mut rows = vec![
        ("key", output::opt(m.key.as_ref())),
        ("version", m.version.to_string()),
        ("token", m.token.to_string()),
        ("etag", m.etag.to_string()),
        ("size", m.size.to_string()),
        ("content_type", m.content_type.clone()),
        ("updated_at", time(&m.updated_at)),
    ];
    if m.fencing_key.as_ref() != m.key.as_ref() {
        rows.push(("fencing_key", output::opt(m.fencing_key.as_ref())));
    }
    if let Some(metadata) = &m.metadata {
        rows.push(("metadata", metadata.as_json().to_string()));
    }
    rows
}

fn written_table(w: &Written) -> String {
    let mut rows = meta_fields(&w.meta);
    rows.push(("created", w.created.to_string()));
    fields(&rows)
}

fn head_table(h: &SnapshotHead) -> String {
    fields(&[
        ("key", h.key.to_string()),
        ("version", h.version.to_string()),
        ("token", h.token.to_string()),
        ("etag", h.etag.to_string()),
        ("size", h.size.to_string()),
        ("content_type", h.content_type.clone()),
        ("last_modified", time(&h.last_modified)),
    ])
}
