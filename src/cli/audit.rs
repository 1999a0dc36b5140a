//! `snapfence audit …`: the refused writes and reconciled recovery records, with the API's filters.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

use super::output::{self, opt, time};
use super::{Ctx, Exit, parse};
use crate::domain::RefusalReason;
use crate::domain::{Cursor, Key, PageLimit, RecoveryReason};
use snapfence_client::{AuditFilter, PageRequest, Recovery, Rejection};

/// The audit subcommands.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Refused fenced writes (stale or unknown tokens), newest first.
    Rejections {
        /// The filters.
        #[command(flatten)]
        filter: Filter,
        /// Only this reason: stale_token or unknown_token.
        #[arg(long, value_parser = parse::refusal_reason)]
        reason: Option<RefusalReason>,
    },
    /// Recovery records replaced by a reconciling acquire, newest first.
    Recoveries {
        /// The filters.
        #[command(flatten)]
        filter: Filter,
        /// Only this reason: abandoned, expired or recovery_required.
        #[arg(long, value_parser = parse::recovery_reason)]
        reason: Option<RecoveryReason>,
    },
}

/// The filters both logs take.
#[derive(Debug, Args)]
pub struct Filter {
    /// Only rows of this key.
    #[arg(long)]
    key: Option<Key>,
    /// Only rows at or after this time: RFC 3339 (2026-12-02T13:05:00Z) or an age (1h).
    #[arg(long, value_parser = parse::time)]
    since: Option<DateTime<Utc>>,
    /// Only rows before this time: RFC 3339 or an age.
    #[arg(long, value_parser = parse::time)]
    until: Option<DateTime<Utc>>,
    /// Rows per page (1..=1000) [default: 100].
    #[arg(long)]
    limit: Option<PageLimit>,
    /// The cursor a previous page printed.
    #[arg(long, value_parser = output::cursor)]
    cursor: Option<Cursor>,
}

impl Filter {
    fn with<R>(self, reason: Option<R>) -> AuditFilter<R> {
        AuditFilter {
            key: self.key,
            reason,
            since: self.since,
            until: self.until,
            page: PageRequest {
                limit: self.limit,
                cursor: self.cursor,
            },
        }
    }
}

/// Runs an audit subcommand.
pub async fn main(ctx: &Ctx, command: AuditCommand) -> Exit {
    match command {
        AuditCommand::Rejections { filter, reason } => {
            match ctx.client.rejections(&filter.with(reason)).await {
                Ok(page) => {
                    ctx.output.print_page(
                        &page,
                        &[
                            "ID",
                            "AT",
                            "KEY",
                            "REASON",
                            "OPERATION",
                            "PRESENTED",
                            "HIGHEST",
                            "HOLDER",
                        ],
                        |r: &Rejection| {
                            vec![
                                r.id.to_string(),
                                time(&r.at),
                                r.key.to_string(),
                                r.reason.as_str().to_owned(),
                                r.operation.as_str().to_owned(),
                                r.presented_token.to_string(),
                                opt(r.highest_token),
                                opt(r.holder.as_ref().map(|h| h.as_str())),
                            ]
                        },
                    );
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, None),
            }
        }
        AuditCommand::Recoveries { filter, reason } => {
            match ctx.client.recoveries(&filter.with(reason)).await {
                Ok(page) => {
                    ctx.output.print_page(
                        &page,
                        &[
                            "ID",
                            "AT",
                            "KEY",
                            "REASON",
                            "OWNER",
                            "TOKEN",
                            "RECONCILED_BY",
                            "NEW_TOKEN",
                            "OPERATION",
                        ],
                        |r: &Recovery| {
                            vec![
                                r.id.to_string(),
                                time(&r.at),
                                r.key.to_string(),
                                r.reason.as_str().to_owned(),
                                r.recovery.owner.as_str().to_owned(),
                                r.recovery.token.to_string(),
                                r.reconciled_by.as_str().to_owned(),
                                r.highest_token.to_string(),
                                r.operation.as_str().to_owned(),
                            ]
                        },
                    );
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, None),
            }
        }
    }
}
