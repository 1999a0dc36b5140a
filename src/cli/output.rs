//! How commands print: answers on stdout as a table or the contract's JSON, errors on stderr (and,
//! with `--output json`, the problem on stdout too).

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use clap::ValueEnum;
use serde::Serialize;

use super::Exit;
use crate::domain::{Cursor, FencingToken, Key, Metadata};
use snapfence_client::{Error, Problem, RefusalFields};

/// How answers are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns, for people.
    Table,
    /// The contract's JSON, pretty-printed, for scripts.
    Json,
}

impl Output {
    /// Prints `value` as JSON, or as the table `table` makes of it.
    pub fn print<T: Serialize>(self, value: &T, table: impl FnOnce(&T) -> String) {
        match self {
            Self::Json => print_json(value),
            Self::Table => print!("{}", table(value)),
        }
    }

    /// Prints a page: its items, and on stderr how to get the next one.
    pub fn print_page<T: Serialize>(
        self,
        page: &snapfence_client::Page<T>,
        headers: &[&str],
        row: impl Fn(&T) -> Vec<String>,
    ) {
        self.print(page, |p| table(headers, p.items.iter().map(&row).collect()));
        if let (Self::Table, Some(cursor)) = (self, &page.next_cursor) {
            eprintln!("more: repeat with --cursor {cursor}");
        }
    }

    /// Prints what a fenced call that answers nothing did.
    pub fn print_done(self, key: &Key, token: FencingToken, result: &'static str) {
        self.print(&Done { key, token, result }, |d| {
            format!("{}: key {} (token {})\n", d.result, d.key, d.token)
        });
    }
}

/// Prints `value` on stdout as pretty-printed JSON.
pub fn print_json<T: Serialize>(value: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("answers serialize")
    );
}

/// What a fenced call that answers nothing did (release, abandon, require-recovery, delete),
/// for `--output json`: `{"key", "token", "result"}`.
#[derive(Debug, Serialize)]
pub struct Done<'a> {
    /// The key.
    pub key: &'a Key,
    /// The token the call was fenced with.
    pub token: FencingToken,
    /// What happened: `released`, `abandoned`, `recovery_required` or `deleted`.
    pub result: &'static str,
}

/// Name–value pairs, one per line, the names aligned.
pub fn fields<N: AsRef<str>>(rows: &[(N, String)]) -> String {
    let width = rows
        .iter()
        .map(|(name, _)| name.as_ref().len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (name, value) in rows {
        let _ = writeln!(out, "{:<width$}  {value}", name.as_ref());
    }
    out
}

/// Columns under headers, each as wide as its widest cell; `(none)` for no rows.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    if rows.is_empty() {
        return "(none)\n".to_owned();
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header_row = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(header_row).chain(rows) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// A time as the contract writes it.
pub fn time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Metadata as compact JSON, `-` for none.
pub fn metadata(m: Option<&Metadata>) -> String {
    m.map_or_else(|| "-".to_owned(), |m| m.as_json().to_string())
}

/// An optional value, `-` for none.
pub fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The `--cursor` of a next page.
pub fn cursor(raw: &str) -> Result<Cursor, std::convert::Infallible> {
    Ok(Cursor::issued(raw))
}

/// Prints what went wrong and what to do next, and returns the exit code for it. `check` says
/// how to find out whether a write whose outcome is unknown took effect.
pub fn report(url: &str, e: &Error, check: Option<&str>) -> Exit {
    eprintln!("snapfence: {}", message(url, e, check));
    Exit::from(e)
}

/// The text of [`report`].
pub fn message(url: &str, e: &Error, check: Option<&str>) -> String {
    match e {
        Error::Transport {
            may_have_reached: false,
            source,
        } => format!(
            "cannot reach the server at {url} ({}); nothing was sent. Check --url (or SNAPFENCE_URL) and that `snapfence serve` is running there",
            causes(source)
        ),
        Error::Transport { source, .. } => format!(
            "{e} ({}). {}",
            causes(source),
            check.unwrap_or("Check the outcome before you retry")
        ),
        Error::Unexpected { request_id, .. } => {
            let id = request_id
                .as_ref()
                .map_or_else(String::new, |id| format!(" (x-request-id {id})"));
            let check = check
                .filter(|_| e.is_indeterminate())
                .map_or_else(String::new, |c| format!(". {c}"));
            format!("{e}{id}{check}")
        }
        Error::Protocol { .. } => {
            format!("{e}. Is {url} a snapfence server? Check --url (or SNAPFENCE_URL)")
        }
        coded => {
            let cli_way = match coded {
                Error::RecoveryRequired { .. } => {
                    ". With this CLI: `snapfence lease acquire KEY --reconciled` (or `snapfence run --reconciled`)"
                }
                Error::TokenRequired { .. } => ". With this CLI: --token, or SNAPFENCE_TOKEN",
                Error::Unauthorized { .. } => ". With this CLI: --api-key, or SNAPFENCE_API_KEY",
                Error::Compacted { .. } => {
                    ". With this CLI: read the keys' state again (`snapfence lease list`, `snapfence snapshot get KEY`), then run `snapfence watch` without --since"
                }
                Error::PreconditionFailed { .. } => {
                    ". With this CLI: `snapfence snapshot get KEY` shows the current ETag (--if-match takes it)"
                }
                _ => "",
            };
            let text = in_cli_terms(coded).unwrap_or_else(|| coded.to_string());
            format!(
                "{}: {text}{cli_way}",
                coded.code().map_or("error", |c| c.as_str())
            )
        }
    }
}

/// The problem details of a failed call, as `--output json` prints them. An answer with a
/// contract code gives the server's problem back as the contract shapes it (`type`, `title`,
/// `status`, `detail`, `code` and the code's own members), rebuilt from the error since the
/// client keeps its parts, not its bytes. A failure without one (no connection, an answer that
/// is not the contract's) is a problem of the same shape whose `code` is null, whose `status` is
/// the HTTP status if there was an answer, and whose `detail` is the message of [`report`].
pub fn problem(url: &str, e: &Error, check: Option<&str>) -> Problem {
    let reason = |status: u16| {
        reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error")
    };
    let Some(code) = e.code() else {
        let (title, status) = match e {
            Error::Unexpected { status, .. } => {
                (reason(status.as_u16()).to_owned(), Some(status.as_u16()))
            }
            other => (other.to_string(), None),
        };
        return Problem {
            type_uri: Some("about:blank".to_owned()),
            title: Some(title),
            status,
            detail: Some(message(url, e, check)),
            code: None,
            holder: None,
            state: None,
            waiters: None,
            recovery: None,
            refusal: None,
            fencing_key: None,
            op_index: None,
        };
    };
    let mut problem = Problem::new(code, reason(code.status()), e.to_string());
    let refusal = |presented_token, highest_token, audit_id| {
        Some(RefusalFields {
            presented_token,
            highest_token,
            audit_id,
        })
    };
    match e {
        Error::LeaseHeld {
            holder,
            state,
            waiters,
            ..
        } => {
            problem.holder = Some((**holder).clone());
            problem.state = *state;
            problem.waiters = *waiters;
        }
        Error::RecoveryRequired { recovery, .. } => {
            problem.recovery = Some((**recovery).clone());
        }
        Error::StaleToken {
            presented,
            highest,
            audit_id,
            ..
        } => problem.refusal = refusal(*presented, Some(*highest), *audit_id),
        Error::UnknownToken {
            presented,
            highest,
            audit_id,
            ..
        } => problem.refusal = refusal(*presented, *highest, *audit_id),
        _ => {}
    }
    problem
}

/// A server detail in the API's terms said in the CLI's (`--ttl 1ms` rather than `ttl_ms 1`).
fn in_cli_terms(e: &Error) -> Option<String> {
    match e {
        Error::InvalidRequest { detail } => {
            let rest = detail.strip_prefix("ttl_ms ")?;
            let (ttl, rest) = rest.split_once(" is out of bounds; this server accepts ")?;
            let (min, max) = rest.strip_suffix(" milliseconds")?.split_once("..=")?;
            let ms = |n: &str| {
                n.parse::<u64>()
                    .ok()
                    .map(|n| short_duration(Duration::from_millis(n)))
            };
            Some(format!(
                "--ttl {} is outside what this server accepts: from {} to {} (its --min-ttl and --max-ttl)",
                ms(ttl)?,
                ms(min)?,
                ms(max)?
            ))
        }
        Error::NotFound { detail } => {
            let missing = detail.strip_suffix("; write one with PUT and a Fencing-Token")?;
            Some(format!(
                "{missing}; write one with `snapfence snapshot put KEY --token TOKEN` (TOKEN: from `snapfence lease acquire KEY`), or run the writer under `snapfence run KEY -- CMD`"
            ))
        }
        _ => None,
    }
}

/// A duration as `--ttl` takes it: `24h`, `1m30s`, `100ms`.
fn short_duration(d: Duration) -> String {
    let mut left = d.as_millis();
    let mut text = String::new();
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if left >= size {
            let _ = write!(text, "{}{unit}", left / size);
            left %= size;
        }
    }
    if text.is_empty() {
        "0s".to_owned()
    } else {
        text
    }
}

/// A transport error's causes, innermost last: reqwest's message names only the URL.
fn causes(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cause = c.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_aligns_its_columns_and_trims_the_last() {
        let t = table(
            &["KEY", "STATE"],
            vec![
                vec!["jobs/1".into(), "held".into()],
                vec!["k".into(), "released".into()],
            ],
        );
        assert_eq!(t, "KEY     STATE\njobs/1  held\nk       released\n");
        assert_eq!(table(&["KEY"], vec![]), "(none)\n");
    }

    #[test]
    fn durations_are_written_as_ttl_takes_them() {
        let ms = |n| short_duration(Duration::from_millis(n));
        assert_eq!(ms(86_400_000), "24h");
        assert_eq!(ms(90_000), "1m30s");
        assert_eq!(ms(100), "100ms");
        assert_eq!(ms(3_600_001), "1h1ms");
        assert_eq!(ms(0), "0s");
    }

    #[test]
    fn fields_align_their_names() {
        assert_eq!(
            fields(&[("key", "k".into()), ("token", "7".into())]),
            "key    k\ntoken  7\n"
        );
    }
}
