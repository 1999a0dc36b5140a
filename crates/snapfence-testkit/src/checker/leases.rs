//! The leases: never two surely live at once on a key, tokens unique and increasing.

use std::collections::HashMap;

use super::*;

impl<'a> Checker<'a> {
    /// The span in which an acknowledged lease was surely live: from its grant's answer until
    /// the latest of its TTL counted from the grant's invocation and each acknowledged renewal's,
    /// cut short by the invocation of any release that may have taken effect.
    pub(super) fn surely_live(&self) -> Vec<(&'a Op, i64, Micros, Micros)> {
        let mut spans = Vec::new();
        for (grant, token) in granted(self.ops) {
            let Call::Acquire { ttl_ms } = grant.call else {
                continue;
            };
            let mut until = grant.invoked + ttl_ms * 1000;
            for op in self.ops.iter().filter(|o| o.key == grant.key) {
                match (&op.call, &op.outcome) {
                    (Call::Renew { token: t, ttl_ms }, Outcome::Ok(_)) if *t == token => {
                        until = until.max(op.invoked + ttl_ms * 1000);
                    }
                    _ => {}
                }
            }
            for op in self.ops.iter().filter(|o| o.key == grant.key) {
                if let (Call::Release { token: t }, Outcome::Ok(_) | Outcome::Indeterminate(_)) =
                    (&op.call, &op.outcome)
                {
                    if *t == token {
                        until = until.min(op.invoked);
                    }
                }
            }
            if grant.completed < until {
                spans.push((grant, token, grant.completed, until));
            }
        }
        spans
    }
    pub(super) fn overlapping_leases(&mut self) {
        let mut by_key: HashMap<&str, Vec<(&Op, i64, Micros, Micros)>> = HashMap::new();
        for span in self.surely_live() {
            by_key.entry(span.0.key.as_str()).or_default().push(span);
        }
        for (key, mut spans) in by_key {
            spans.sort_by_key(|s| s.2);
            // Against the span reaching furthest so far: any overlap shows with it.
            let mut reach: Option<(&Op, i64, Micros)> = None;
            for (op, token, from, until) in spans {
                if let Some((other, t, end)) = reach {
                    if from < end && t != token {
                        self.flag(
                            Property::OverlappingLeases,
                            format!(
                                "{key:?}: op {} holds token {token} from {from} while op {} still \
                                 surely holds token {t} until {end}",
                                op.id, other.id
                            ),
                        );
                    }
                }
                if reach.is_none_or(|(_, _, end)| until > end) {
                    reach = Some((op, token, until));
                }
            }
        }
    }
    pub(super) fn token_uniqueness_and_order(&mut self) {
        let mut seen: HashMap<i64, u64> = HashMap::new();
        let grants: Vec<(&Op, i64)> = granted(self.ops).collect();
        for (op, token) in &grants {
            if let Some(first) = seen.insert(*token, op.id) {
                self.flag(
                    Property::TokenReissued,
                    format!(
                        "token {token} was granted by op {first} and again by op {}",
                        op.id
                    ),
                );
            }
        }
        let mut by_completion: Vec<&(&Op, i64)> = grants.iter().collect();
        by_completion.sort_by_key(|(op, _)| op.completed);
        let mut by_invocation: Vec<&(&Op, i64)> = grants.iter().collect();
        by_invocation.sort_by_key(|(op, _)| op.invoked);
        let mut done = 0;
        let mut highest: Option<(i64, u64)> = None;
        for (op, token) in by_invocation {
            while done < by_completion.len() && by_completion[done].0.completed < op.invoked {
                let (earlier, t) = by_completion[done];
                if highest.is_none_or(|(h, _)| *t > h) {
                    highest = Some((*t, earlier.id));
                }
                done += 1;
            }
            if let Some((h, earlier)) = highest {
                if *token <= h {
                    self.flag(
                        Property::TokenRegression,
                        format!(
                            "op {} was granted token {token}, not above token {h} that op \
                             {earlier} was granted before op {} was sent",
                            op.id, op.id
                        ),
                    );
                }
            }
        }
    }
}
