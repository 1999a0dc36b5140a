//! The reads: each sees every write acknowledged before it, and only writes that were made.

use std::collections::HashMap;

use super::*;

impl<'a> Checker<'a> {
    pub(super) fn reads(&mut self) {
        let end = self.end;
        let mut writes: HashMap<(&str, &str), (&Op, Asked<'_>)> = HashMap::new();
        let mut acked: HashMap<&str, Vec<(Micros, i64, u64)>> = HashMap::new();
        for op in self.ops {
            for w in asked(op) {
                if let Some(version) = w.acknowledged {
                    acked
                        .entry(w.key)
                        .or_default()
                        .push((op.completed, version, op.id));
                }
                writes.insert((w.key, w.etag), (op, w));
            }
        }
        for op in self.ops {
            let (Call::Get, Outcome::Ok(Answer::Read(seen))) = (&op.call, &op.outcome) else {
                continue;
            };
            let seen_version = seen.as_ref().map_or(0, |v| v.version);
            if let Some(before) = acked.get(op.key.as_str()) {
                if let Some((_, v, w)) = before
                    .iter()
                    .filter(|(at, _, _)| *at < op.invoked)
                    .max_by_key(|(_, v, _)| *v)
                {
                    if *v > seen_version {
                        self.flag(
                            Property::StaleRead,
                            format!(
                                "op {} read version {seen_version} of {:?} after op {w} was \
                                 acknowledged as version {v}",
                                op.id, op.key
                            ),
                        );
                    }
                }
            }
            let Some(seen) = seen else { continue };
            match writes.get(&(op.key.as_str(), seen.etag.as_str())) {
                Some((w, asked)) => {
                    let consistent = match (asked.acknowledged, &w.outcome) {
                        (Some(version), _) => asked.token == seen.token && version == seen.version,
                        (None, Outcome::Indeterminate(_)) => asked.token == seen.token,
                        _ => false,
                    };
                    if !consistent {
                        self.flag(
                            Property::PhantomWrite,
                            format!(
                                "op {} read version {} of {:?} (token {}), the body of op {} \
                                 whose outcome was {:?}",
                                op.id, seen.version, op.key, seen.token, w.id, w.outcome
                            ),
                        );
                    }
                }
                None => self.flag(
                    Property::PhantomWrite,
                    format!(
                        "op {} read version {} of {:?}, a body no operation wrote",
                        op.id, seen.version, op.key
                    ),
                ),
            }
            let kept = end
                .versions
                .get(&op.key)
                .and_then(|vs| vs.iter().find(|v| v.version == seen.version));
            if kept != Some(seen) {
                self.flag(
                    Property::LostWrite,
                    format!(
                        "op {} read version {} of {:?} (etag {}), which the end does not hold",
                        op.id, seen.version, op.key, seen.etag
                    ),
                );
            }
        }
    }
}
