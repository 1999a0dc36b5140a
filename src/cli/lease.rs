//! `snapfence lease …`: one subcommand per lease endpoint.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::output::{self, fields, metadata, opt, time};
use super::{Ctx, Exit, parse};
use crate::domain::{
    Cursor, FencingToken, Key, KeyPrefix, KeyStatus, Lease, LeaseState, Metadata, Owner, PageLimit,
    RecoveryRecord, Waiter,
};
use snapfence_client::{AcquireRequest, Grant, LeaseFilter, PageRequest};

/// The lease subcommands.
#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Acquire a key; prints the grant with its fencing token. With --wait, waits in the key's
    /// queue on the server while it is held.
    Acquire {
        /// The key.
        key: Key,
        /// Who holds it [default: USER@HOST].
        #[arg(long)]
        owner: Option<Owner>,
        /// How long the lease lasts unless renewed.
        #[arg(long, value_parser = parse::ttl, default_value = "30s")]
        ttl: Duration,
        /// A JSON object kept with the lease, e.g. '{"pid": 4242}'.
        #[arg(long, value_parser = parse::metadata)]
        metadata: Option<Metadata>,
        /// Leave a recovery record if the lease expires instead of being released.
        #[arg(long)]
        crash_recovery: bool,
        /// State that what a previous holder left behind is dealt with, replacing its recovery
        /// record.
        #[arg(long, conflicts_with = "reconciling")]
        reconciled: bool,
        /// Reconcile while holding the key: a retained recovery record is kept (and printed as
        /// recovery.*) under this lease, everyone else is refused meanwhile, and the record goes
        /// only when you confirm with `snapfence lease reconciled KEY --token N`; if the lease
        /// ends first, the record stays as it was.
        #[arg(long)]
        reconciling: bool,
        /// While someone else holds the key, wait up to this long (at most 5m) in its queue on
        /// the server, behind those who came first, then fail as without it [default: fail at
        /// once].
        #[arg(long, value_parser = parse::wait)]
        wait: Option<Duration>,
    },
    /// Renew a live lease; prints it with its new expiry.
    Renew {
        /// The key and the lease's token.
        #[command(flatten)]
        fenced: Fenced,
        /// A new TTL [default: the lease's own].
        #[arg(long, value_parser = parse::ttl)]
        ttl: Option<Duration>,
    },
    /// Release a lease; the key is free at once (unless it was marked by require-recovery).
    Release(Fenced),
    /// Give a lease up but keep a recovery record, so that the next holder must reconcile.
    Abandon(Fenced),
    /// Mark cleanup incomplete while still holding: the lease's end leaves a recovery record.
    RequireRecovery(Fenced),
    /// Confirm, as the holder of a lease acquired with --reconciling, that what the previous
    /// holder left behind no longer conflicts: the recovery record the lease keeps moves to the
    /// audit log and the lease goes on; prints the lease.
    Reconciled(Fenced),
    /// Show a key's state, newest lease and recovery record.
    Show {
        /// The key.
        key: Key,
    },
    /// List the acquires waiting for a key (--wait), first to be granted first.
    Waiters {
        /// The key.
        key: Key,
        /// Waiters per page (1..=1000) [default: 100].
        #[arg(long)]
        limit: Option<PageLimit>,
        /// The cursor a previous page printed.
        #[arg(long, value_parser = output::cursor)]
        cursor: Option<Cursor>,
    },
    /// List keys in key order, a page at a time.
    List {
        /// Only keys starting with this.
        #[arg(long, value_parser = parse::prefix)]
        prefix: Option<KeyPrefix>,
        /// Only keys in this state: held, expired, released, recovery_pending.
        #[arg(long, value_parser = parse::state)]
        state: Option<LeaseState>,
        /// Keys per page (1..=1000) [default: 100].
        #[arg(long)]
        limit: Option<PageLimit>,
        /// The cursor a previous page printed.
        #[arg(long, value_parser = output::cursor)]
        cursor: Option<Cursor>,
    },
}

/// A key and the token of its lease, for fenced calls.
#[derive(Debug, Args)]
pub struct Fenced {
    /// The key.
    pub key: Key,
    /// The lease's fencing token.
    #[arg(long, env = "SNAPFENCE_TOKEN", value_parser = parse::token)]
    pub token: FencingToken,
}

/// Runs a lease subcommand.
pub async fn main(ctx: &Ctx, command: LeaseCommand) -> Exit {
    match command {
        LeaseCommand::Acquire {
            key,
            owner,
            ttl,
            metadata,
            crash_recovery,
            reconciled,
            reconciling,
            wait,
        } => {
            let mut request = AcquireRequest::new(owner.unwrap_or_else(super::default_owner), ttl)
                .crash_recovery(crash_recovery)
                .reconciled(reconciled)
                .reconciling(reconciling)
                .wait(wait.unwrap_or_default());
            if let Some(m) = metadata {
                request = request.metadata(m);
            }
            let check = format!(
                "Check with `snapfence lease show {key}`; a lease granted to you whose token you did not get expires by itself"
            );
            match ctx.client.acquire(&key, &request).await {
                Ok(grant) => {
                    ctx.output.print(&grant, grant_table);
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, Some(&check)),
            }
        }
        LeaseCommand::Renew { fenced, ttl } => {
            match ctx.client.renew(&fenced.key, fenced.token, ttl).await {
                Ok(lease) => {
                    ctx.output.print(&lease, |l| fields(&lease_fields(l)));
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, None),
            }
        }
        LeaseCommand::Release(f) => end(ctx, f, Ending::Release).await,
        LeaseCommand::Abandon(f) => end(ctx, f, Ending::Abandon).await,
        LeaseCommand::RequireRecovery(f) => end(ctx, f, Ending::RequireRecovery).await,
        LeaseCommand::Reconciled(Fenced { key, token }) => {
            let check = format!(
                "Check with `snapfence lease show {key}` whether token {token} is still the live lease and the record is gone"
            );
            match ctx.client.reconciled(&key, token).await {
                Ok(lease) => {
                    ctx.output.print(&lease, |l| fields(&lease_fields(l)));
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, Some(&check)),
            }
        }
        LeaseCommand::Show { key } => match ctx.client.lease_status(&key).await {
            Ok(status) => {
                ctx.output.print(&status, status_table);
                Exit::Success
            }
            Err(e) => ctx.fail(&e, None),
        },
        LeaseCommand::Waiters { key, limit, cursor } => {
            match ctx
                .client
                .lease_waiters(&key, &PageRequest { limit, cursor })
                .await
            {
                Ok(page) => {
                    ctx.output
                        .print_page(&page, &["POSITION", "OWNER", "SINCE"], |w: &Waiter| {
                            vec![
                                w.position.to_string(),
                                opt(w.owner.as_ref()),
                                time(&w.since),
                            ]
                        });
                    Exit::Success
                }
                Err(e) => ctx.fail(&e, None),
            }
        }
        LeaseCommand::List {
            prefix,
            state,
            limit,
            cursor,
        } => {
            let filter = LeaseFilter {
                prefix,
                state,
                page: PageRequest { limit, cursor },
            };
            match ctx.client.list_leases(&filter).await {
                Ok(page) => {
                    ctx.output.print_page(
                        &page,
                        &["KEY", "STATE", "OWNER", "TOKEN", "EXPIRES_AT", "RECOVERY"],
                        |s: &KeyStatus| {
                            vec![
                                s.key.to_string(),
                                s.state.as_str().to_owned(),
                                s.lease.owner.as_str().to_owned(),
                                s.lease.token.to_string(),
                                time(&s.lease.expires_at),
                                opt(s.recovery.as_ref().map(|r| r.reason.as_str())),
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

#[derive(Debug, Clone, Copy)]
enum Ending {
    Release,
    Abandon,
    RequireRecovery,
}

async fn end(ctx: &Ctx, Fenced { key, token }: Fenced, ending: Ending) -> Exit {
    let (answer, result) = match ending {
        Ending::Release => (ctx.client.release(&key, token).await, "released"),
        Ending::Abandon => (ctx.client.abandon(&key, token).await, "abandoned"),
        Ending::RequireRecovery => (
            ctx.client.require_recovery(&key, token).await,
            "recovery_required",
        ),
    };
    let check = format!(
        "Check with `snapfence lease show {key}` whether token {token} is still the live lease"
    );
    match answer {
        Ok(()) => {
            ctx.output.print_done(&key, token, result);
            Exit::Success
        }
        Err(e) => ctx.fail(&e, Some(&check)),
    }
}

fn lease_fields(l: &Lease) -> Vec<(&'static str, String)> {
    vec![
        ("key", l.key.to_string()),
        ("owner", l.owner.as_str().to_owned()),
        ("token", l.token.to_string()),
        ("acquired_at", time(&l.acquired_at)),
        ("expires_at", time(&l.expires_at)),
        (
            "ttl",
            humantime::format_duration(l.ttl_ms.duration()).to_string(),
        ),
        ("metadata", metadata(l.metadata.as_ref())),
        ("crash_recovery", l.crash_recovery.to_string()),
        ("recovery_required", l.recovery_required.to_string()),
    ]
}

fn recovery_fields(prefix: &str, r: &RecoveryRecord) -> Vec<(String, String)> {
    let rows = vec![
        ("reason", r.reason.as_str().to_owned()),
        ("owner", r.owner.as_str().to_owned()),
        ("token", r.token.to_string()),
        ("acquired_at", time(&r.acquired_at)),
        ("ended_at", time(&r.ended_at)),
        ("metadata", metadata(r.metadata.as_ref())),
    ];
    prefixed(&format!("{prefix}."), rows)
}

fn with_recovery(
    mut rows: Vec<(String, String)>,
    prefix: &str,
    r: Option<&RecoveryRecord>,
) -> String {
    if let Some(r) = r {
        rows.extend(recovery_fields(prefix, r));
    }
    fields(&rows)
}

fn prefixed(prefix: &str, rows: Vec<(&'static str, String)>) -> Vec<(String, String)> {
    rows.into_iter()
        .map(|(n, v)| (format!("{prefix}{n}"), v))
        .collect()
}

fn grant_table(g: &Grant) -> String {
    let mut rows = prefixed("", lease_fields(&g.lease));
    if let Some(kept) = &g.recovery {
        rows.extend(recovery_fields("recovery", kept));
    }
    with_recovery(rows, "recovered", g.recovered.as_ref())
}

fn status_table(s: &KeyStatus) -> String {
    let mut rows = vec![
        ("state".to_owned(), s.state.as_str().to_owned()),
        ("newest_token".to_owned(), s.newest_token.to_string()),
        ("waiters".to_owned(), s.waiters.to_string()),
    ];
    rows.extend(prefixed("lease.", lease_fields(&s.lease)));
    with_recovery(rows, "recovery", s.recovery.as_ref())
}
