//! `snapfence watch`: changes one line each, resuming after a broken stream without losing or
//! repeating one.

use std::fmt::Write as _;
use std::io::Write as _;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};

use super::output::time;
use super::{Ctx, Exit, Output, parse};
use crate::domain::{ChangeEvent, ChangeId, ChangeReason, KeyPrefix};
use snapfence_client::WatchOptions;

/// The options of `snapfence watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only keys starting with this [default: every key].
    #[arg(long, value_parser = parse::prefix)]
    prefix: Option<KeyPrefix>,
    /// Start after this change id: the first column of a line printed before, or 0 for the
    /// oldest change the server keeps [default: the changes from now on].
    #[arg(long, value_parser = parse::change_id)]
    since: Option<ChangeId>,
    /// Exit (0) after this many events [default: run until interrupted].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
}

/// Runs `snapfence watch`.
pub async fn main(ctx: &Ctx, args: WatchArgs) -> Exit {
    // Ctrl-C or SIGTERM ends a watch without --count normally, after a whole line.
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("snapfence: cannot handle signals: {e}");
            return Exit::Failure;
        }
    };
    let options = WatchOptions {
        prefix: args.prefix,
        since: args.since,
    };
    let mut watch = ctx.client.watch(&options);
    let mut printed = 0;
    while args.count.is_none_or(|count| printed < count) {
        let next = tokio::select! {
            next = watch.next() => next,
            _ = interrupt.recv() => return Exit::Success,
            _ = terminate.recv() => return Exit::Success,
        };
        match next {
            Some(Ok(change)) => {
                let line = match ctx.output {
                    Output::Json => serde_json::to_string(&change).expect("changes serialize"),
                    Output::Table => text(&change),
                };
                if writeln!(std::io::stdout(), "{line}").is_err() {
                    return Exit::Success;
                }
                printed += 1;
            }
            Some(Err(e)) => return ctx.fail(&e, None),
            None => unreachable!("a watch ends only with an error"),
        }
    }
    Exit::Success
}

/// One change as a line: its id, kind and key, then `name=value` for each member of its data
/// that it has, named and ordered as in the JSON, `at` last. A value with a space, a quote, a
/// backslash or an `=` (or an empty one) is written as a JSON string, so that a line splits on
/// spaces and `=` the same way whatever the keys are.
pub fn text(change: &ChangeEvent) -> String {
    let d = &change.data;
    let mut line = format!(
        "{} {} {} token={}",
        change.id,
        change.event,
        word(d.key.as_str()),
        d.token
    );
    let mut field = |name: &str, value: Option<String>| {
        if let Some(value) = value {
            let _ = write!(line, " {name}={value}");
        }
    };
    field("owner", d.owner.as_ref().map(|o| word(o.as_str())));
    field("holder", d.holder.as_ref().map(|o| word(o.as_str())));
    field(
        "fencing_key",
        d.fencing_key
            .as_ref()
            .filter(|f| **f != d.key)
            .map(|f| word(f.as_str())),
    );
    field("expires_at", d.expires_at.as_ref().map(time));
    field("version", d.version.map(|v| v.to_string()));
    field("etag", d.etag.as_ref().map(|e| e.to_string()));
    field(
        "reason",
        d.reason.map(|r| match r {
            ChangeReason::Refusal(r) => r.as_str().to_owned(),
            ChangeReason::Recovery(r) => r.as_str().to_owned(),
        }),
    );
    field("operation", d.operation.map(|o| o.as_str().to_owned()));
    field("audit_id", d.audit_id.map(|a| a.to_string()));
    field("highest_token", d.highest_token.map(|t| t.to_string()));
    field("record_token", d.record_token.map(|t| t.to_string()));
    field("txn", d.txn.map(|t| t.to_string()));
    field("txn_size", d.txn_size.map(|n| n.to_string()));
    field("at", Some(time(&d.at)));
    line
}

/// `s`, or a JSON string when splitting on spaces and `=` would cut it.
fn word(s: &str) -> String {
    let plain = !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '"' | '\\' | '='));
    if plain {
        s.to_owned()
    } else {
        serde_json::to_string(s).expect("strings serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_that_would_split_a_line_is_quoted() {
        assert_eq!(word("jobs/7"), "jobs/7");
        assert_eq!(word("my job"), r#""my job""#);
        assert_eq!(word("a=b"), r#""a=b""#);
        assert_eq!(word(r#"say "hi""#), r#""say \"hi\"""#);
        assert_eq!(word(""), r#""""#);
    }

    #[test]
    fn a_line_names_each_member_the_change_has_and_ends_with_its_time() {
        let change: ChangeEvent = serde_json::from_value(serde_json::json!({
            "id": 42, "event": "write.refused",
            "data": {"key": "jobs/7", "token": 3, "at": "2026-12-04T18:00:00.000Z",
                     "holder": "worker 2", "reason": "stale_token", "audit_id": 5,
                     "operation": "put", "highest_token": 4}
        }))
        .unwrap();
        assert_eq!(
            text(&change),
            r#"42 write.refused jobs/7 token=3 holder="worker 2" reason=stale_token operation=put audit_id=5 highest_token=4 at=2026-12-04T18:00:00.000Z"#
        );
    }
}
