//! Keys, and the prefixes that select them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::InvalidInput;

/// The longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;

/// The first control character of `s`, if any.
pub(crate) fn control_char(s: &str) -> Option<char> {
    s.chars().find(|c| c.is_control())
}

/// Whether every `%` of percent-encoded `raw` begins an escape (`%` and two hex digits): read
/// leniently, `a%ZZb` would name the key that `a%25ZZb` names.
pub fn well_escaped(raw: &str) -> bool {
    raw.split('%')
        .skip(1)
        .all(|rest| rest.bytes().take(2).filter(u8::is_ascii_hexdigit).count() == 2)
}

/// A key: one path segment of 1..=512 bytes of UTF-8 without control characters. Leases and
/// snapshots share one key space.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Key(String);

/// Shown quoted, as the string it is, so that messages read `key "jobs/42"`.
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl Key {
    /// Checks a decoded key against the contract's rules.
    pub fn parse(raw: impl Into<String>) -> Result<Self, InvalidInput> {
        let raw = raw.into();
        if raw.is_empty() {
            return Err(InvalidInput::new("key must not be empty"));
        }
        if raw.len() > MAX_KEY_BYTES {
            return Err(InvalidInput::new(format!(
                "key is {} bytes long; at most {MAX_KEY_BYTES} bytes of UTF-8 are allowed",
                raw.len()
            )));
        }
        if let Some(c) = control_char(&raw) {
            return Err(InvalidInput::new(format!(
                "key contains the control character {c:?}; use printable characters only"
            )));
        }
        Ok(Self(raw))
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as one URL path segment, and so as a `Fencing-Key` header: every byte but RFC
    /// 3986's unreserved characters percent-encoded (`jobs/42` is `jobs%2F42`).
    pub fn to_segment(&self) -> String {
        const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'.')
            .remove(b'_')
            .remove(b'~');
        percent_encoding::utf8_percent_encode(&self.0, UNRESERVED).to_string()
    }

    /// A key sent as one percent-encoded segment: every `%` begins two hex digits, and the
    /// decoded bytes are UTF-8 and a valid key.
    pub fn from_segment(raw: &str) -> Result<Self, InvalidInput> {
        let malformed = || {
            InvalidInput::new(format!(
                "{raw:?} is not a percent-encoded key; encode it as a key in a path is (jobs%2F42)"
            ))
        };
        if !well_escaped(raw) {
            return Err(malformed());
        }
        let decoded = percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map_err(|_| malformed())?;
        Self::parse(decoded.into_owned())
    }

    /// Whether this key is in the namespace of `fence` (v1.3): `fence` itself, or a key that
    /// begins with `fence/`.
    pub fn in_namespace_of(&self, fence: &Key) -> bool {
        self.0
            .strip_prefix(fence.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Key {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<Self, InvalidInput> {
        Self::parse(raw)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for KeyPrefix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A prefix that selects keys in a list. Empty selects every key.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    /// Checks a prefix: at most as long as a key, without control characters.
    pub fn parse(raw: impl Into<String>) -> Result<Self, InvalidInput> {
        let raw = raw.into();
        if raw.len() > MAX_KEY_BYTES {
            return Err(InvalidInput::new(format!(
                "prefix is {} bytes long; at most {MAX_KEY_BYTES} bytes are allowed",
                raw.len()
            )));
        }
        if let Some(c) = control_char(&raw) {
            return Err(InvalidInput::new(format!(
                "prefix contains the control character {c:?}"
            )));
        }
        Ok(Self(raw))
    }

    /// The prefix text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether every key this prefix selects in `fence`'s namespace is there, and it names part
    /// of it (v1.3): `fence` itself, or a prefix that begins with `fence/`.
    pub fn in_namespace_of(&self, fence: &Key) -> bool {
        self.0
            .strip_prefix(fence.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// Whether `key` starts with this prefix.
    pub fn selects(&self, key: &Key) -> bool {
        key.as_str().starts_with(&self.0)
    }

    /// The smallest string, in code point order (which is the byte order of UTF-8 and so the
    /// order of the `"C"` collation), greater than every string that starts with this prefix.
    /// With it a prefix scan is a closed index range instead of a scan to the end of the table.
    /// Where no such string exists (the empty prefix, or one made only of U+10FFFF) it is a
    /// string greater than every valid key: 129 times U+10FFFF, longer than any key can be.
    pub fn upper_bound(&self) -> String {
        let mut chars: Vec<char> = self.0.chars().collect();
        while let Some(last) = chars.pop() {
            let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
            if let Some(next) = next {
                chars.push(next);
                return chars.into_iter().collect();
            }
        }
        std::iter::repeat_n(char::MAX, MAX_KEY_BYTES / 4 + 1).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_accepts_slashes_and_unicode_up_to_512_bytes() {
        assert!(Key::parse("jobs/42").is_ok());
        assert!(Key::parse("é".repeat(256)).is_ok());
        assert!(Key::parse("a".repeat(512)).is_ok());
    }

    #[test]
    fn a_key_reads_back_from_its_segment_and_a_malformed_one_is_refused() {
        for raw in ["jobs/42", "a b%é", "v1.2~x_y-z", "𝄞/x"] {
            let key = Key::parse(raw).unwrap();
            assert_eq!(Key::from_segment(&key.to_segment()).unwrap(), key);
        }
        assert_eq!(Key::parse("jobs/42").unwrap().to_segment(), "jobs%2F42");
        assert_eq!(Key::parse("a b%é").unwrap().to_segment(), "a%20b%25%C3%A9");
        for bad in ["jobs%2", "%FF", "%zz", "", "%00"] {
            assert!(Key::from_segment(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_namespace_is_its_key_and_the_keys_under_it() {
        let fence = Key::parse("threads/42").unwrap();
        for inside in ["threads/42", "threads/42/c/1", "threads/42/"] {
            assert!(
                Key::parse(inside).unwrap().in_namespace_of(&fence),
                "{inside}"
            );
        }
        for outside in ["threads/420", "threads/4", "threads", "other/threads/42"] {
            assert!(
                !Key::parse(outside).unwrap().in_namespace_of(&fence),
                "{outside}"
            );
        }
        assert!(
            KeyPrefix::parse("threads/42/w/")
                .unwrap()
                .in_namespace_of(&fence)
        );
        assert!(
            KeyPrefix::parse("threads/42")
                .unwrap()
                .in_namespace_of(&fence)
        );
        assert!(
            !KeyPrefix::parse("threads/4")
                .unwrap()
                .in_namespace_of(&fence)
        );
    }

    #[test]
    fn key_rejects_empty_long_and_control_characters() {
        assert!(Key::parse("").is_err());
        assert!(Key::parse("a".repeat(513)).is_err());
        assert!(Key::parse("a\nb").is_err());
        assert!(Key::parse("a\u{7f}").is_err());
    }

    #[test]
    fn prefix_upper_bound_closes_the_range() {
        let p = |s: &str| KeyPrefix::parse(s).unwrap().upper_bound();
        assert_eq!(p("jobs/"), "jobs0");
        assert_eq!(p("a\u{10FFFF}"), "b");
        // The surrogate range is skipped: U+D7FF is followed by U+E000.
        assert_eq!(p("\u{D7FF}"), "\u{E000}");
        let bound = p("jobs/");
        for key in ["jobs/", "jobs/1", "jobs/\u{10FFFF}\u{10FFFF}"] {
            assert!(key < bound.as_str() && key >= "jobs/");
        }
    }

    #[test]
    fn prefix_without_successor_is_bounded_above_every_key() {
        let longest = Key::parse("\u{10FFFF}".repeat(128)).unwrap();
        for prefix in ["", "\u{10FFFF}"] {
            let bound = KeyPrefix::parse(prefix).unwrap().upper_bound();
            assert!(longest.as_str() < bound.as_str());
        }
    }
}
