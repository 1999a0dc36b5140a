//! Snapshot metadata and entity tags.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{FencingToken, InvalidInput, Key, Metadata, Version, rfc3339_millis};

/// A strong entity tag: the quoted SHA-256 of the body, e.g. `"9f86d0…"`. The same text is
/// sent in the `ETag` header and in JSON, as S3 does, so a client can pass either to `If-Match`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ETag(String);

impl ETag {
    /// The entity tag of a body.
    pub fn of(body: &[u8]) -> Self {
        Self(format!("\"{}\"", hex::encode(Sha256::digest(body))))
    }

    /// An entity tag read back from the database.
    pub fn from_stored(raw: String) -> Self {
        Self(raw)
    }

    /// The quoted entity tag.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Checks an entity tag as a server sent it: quoted visible ASCII, e.g. `"9f86d0…"`.
    pub fn parse(raw: impl Into<String>) -> Result<Self, InvalidInput> {
        let raw = raw.into();
        let inner = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"'));
        match inner {
            Some(o) if !o.is_empty() && o.bytes().all(|b| b.is_ascii_graphic() && b != b'"') => {
                Ok(Self(raw))
            }
            _ => Err(InvalidInput::new(format!(
                "entity tag {raw:?} is malformed; an ETag is quoted visible ASCII, e.g. \"9f86d0…\""
            ))),
        }
    }

    /// The tag without its quotes, for comparison.
    fn opaque(&self) -> &str {
        self.0.trim_matches('"')
    }
}

impl<'de> Deserialize<'de> for ETag {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for ETag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The parsed value of an `If-Match` or `If-None-Match` header: `*` or a list of entity tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntityTagCondition {
    /// `*`: any current representation.
    Any,
    /// A list of entity tags; `weak` marks those sent as `W/"…"`.
    Tags(Vec<(bool, String)>),
}

impl EntityTagCondition {
    /// Parses the header value. Tags are taken quoted, as RFC 9110 writes them; a bare tag
    /// without quotes is accepted too, since scripts often drop the quotes.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let raw = raw.trim();
        if raw == "*" {
            return Ok(Self::Any);
        }
        let malformed = || {
            InvalidInput::new(format!(
                "entity tag list {raw:?} is malformed; send the ETag exactly as the server gave it, e.g. If-Match: \"9f86d0…\""
            ))
        };
        // etagc (RFC 9110): visible ASCII but the double quote; commas are allowed inside quotes.
        let etagc = |o: &str| o.bytes().all(|b| b.is_ascii_graphic() && b != b'"');
        let mut tags = Vec::new();
        let mut rest = raw;
        loop {
            rest = rest.trim_start();
            let weak = rest.starts_with("W/");
            if weak {
                rest = &rest[2..];
            }
            let opaque = if let Some(quoted) = rest.strip_prefix('"') {
                let end = quoted.find('"').ok_or_else(malformed)?;
                rest = &quoted[end + 1..];
                &quoted[..end]
            } else {
                // A bare tag (quotes dropped by a script) runs to the next comma.
                let end = rest.find(',').unwrap_or(rest.len());
                let bare = rest[..end].trim_end();
                rest = &rest[end..];
                if bare.is_empty() {
                    return Err(malformed());
                }
                bare
            };
            if !etagc(opaque) {
                return Err(malformed());
            }
            tags.push((weak, opaque.to_string()));
            rest = rest.trim_start();
            match rest.strip_prefix(',') {
                Some(next) => rest = next,
                None if rest.is_empty() => break,
                None => return Err(malformed()),
            }
        }
        Ok(Self::Tags(tags))
    }

    /// `If-Match`: strong comparison, so a weak tag never matches.
    pub fn matches_strong(&self, current: Option<&ETag>) -> bool {
        match (self, current) {
            (_, None) => false,
            (Self::Any, Some(_)) => true,
            (Self::Tags(tags), Some(etag)) => {
                tags.iter().any(|(weak, t)| !weak && t == etag.opaque())
            }
        }
    }

    /// `If-None-Match`: weak comparison.
    pub fn matches_weak(&self, current: &ETag) -> bool {
        match self {
            Self::Any => true,
            Self::Tags(tags) => tags.iter().any(|(_, t)| t == current.opaque()),
        }
    }

    /// The tags to compare weakly with in SQL (RFC 9110 13.1.2, as [`Self::matches_weak`]):
    /// every tag, weak or not, quoted as stored ETags are; `*` for any.
    pub fn weak_tags(&self) -> Vec<String> {
        match self {
            Self::Any => vec!["*".to_owned()],
            Self::Tags(tags) => tags.iter().map(|(_, t)| format!("\"{t}\"")).collect(),
        }
    }

    /// The single strong tag to compare with in SQL, when the condition reduces to one; `None`
    /// for `*`. A list of several tags is kept in Rust and checked against each.
    pub fn strong_tags(&self) -> Option<Vec<String>> {
        match self {
            Self::Any => None,
            Self::Tags(tags) => Some(
                tags.iter()
                    .filter(|(weak, _)| !weak)
                    .map(|(_, t)| format!("\"{t}\""))
                    .collect(),
            ),
        }
    }
}

/// The header value, as RFC 9110 writes it: `*` or a list of quoted tags.
impl std::fmt::Display for EntityTagCondition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Tags(tags) => {
                for (i, (weak, tag)) in tags.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    let weak = if *weak { "W/" } else { "" };
                    write!(f, "{sep}{weak}\"{tag}\"")?;
                }
                Ok(())
            }
        }
    }
}

impl From<&ETag> for EntityTagCondition {
    fn from(etag: &ETag) -> Self {
        Self::Tags(vec![(false, etag.opaque().to_owned())])
    }
}

/// The order of a listing of snapshot keys (v1.3 `order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListOrder {
    /// Byte order of the keys' UTF-8.
    #[default]
    Asc,
    /// Reversed.
    Desc,
}

impl ListOrder {
    /// The contract's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Asc => "asc",
            Self::Desc => "desc",
        }
    }
}

/// One stored version of a snapshot, without its body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// The key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Key>,
    /// Its version: the count of accepted writes of the key when it was written.
    pub version: Version,
    /// The token that wrote it.
    pub token: FencingToken,
    /// Its strong entity tag.
    pub etag: ETag,
    /// Its size in bytes.
    pub size: i64,
    /// Its content type.
    pub content_type: String,
    /// When it was written (database clock).
    #[serde(with = "rfc3339_millis")]
    pub updated_at: DateTime<Utc>,
    /// The lease that fenced the write: the key itself, or a key whose namespace holds it
    /// (v1.3). Absent only from servers before v1.3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_key: Option<Key>,
    /// The version's `Snapshot-Metadata` (v1.3), null when it has none.
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_is_the_quoted_sha256() {
        assert_eq!(
            ETag::of(b"test").as_str(),
            "\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\""
        );
    }

    #[test]
    fn if_match_compares_strongly() {
        let tag = ETag::of(b"x");
        let quoted = EntityTagCondition::parse(tag.as_str()).unwrap();
        assert!(quoted.matches_strong(Some(&tag)));
        let bare = EntityTagCondition::parse(tag.as_str().trim_matches('"')).unwrap();
        assert!(bare.matches_strong(Some(&tag)));
        let weak = EntityTagCondition::parse(&format!("W/{}", tag.as_str())).unwrap();
        assert!(!weak.matches_strong(Some(&tag)));
        assert!(weak.matches_weak(&tag));
        assert!(EntityTagCondition::Any.matches_strong(Some(&tag)));
        assert!(!EntityTagCondition::Any.matches_strong(None));
        let list = EntityTagCondition::parse(&format!("\"a\", {}", tag.as_str())).unwrap();
        assert!(list.matches_strong(Some(&tag)));
    }

    #[test]
    fn a_condition_renders_as_the_header_it_was_parsed_from() {
        for raw in ["*", "\"a\"", "\"a\", W/\"b\"", "W/\"a,b\", \"\""] {
            assert_eq!(EntityTagCondition::parse(raw).unwrap().to_string(), raw);
        }
        assert_eq!(EntityTagCondition::parse("a").unwrap().to_string(), "\"a\"");
        let tag = ETag::of(b"x");
        assert_eq!(EntityTagCondition::from(&tag).to_string(), tag.as_str());
    }

    #[test]
    fn an_etag_from_a_server_must_be_quoted() {
        assert!(ETag::parse(ETag::of(b"x").as_str()).is_ok());
        for bad in ["", "\"\"", "abc", "\"a b\"", "W/\"a\""] {
            assert!(ETag::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_empty_quoted_tag_and_commas_inside_quotes_are_well_formed() {
        assert!(EntityTagCondition::parse("\"\"").is_ok());
        assert!(EntityTagCondition::parse("W/\"\", \"\"").is_ok());
        let list = EntityTagCondition::parse("W/\"a,b\", \"c\"").unwrap();
        assert_eq!(
            list,
            EntityTagCondition::Tags(vec![(true, "a,b".into()), (false, "c".into())])
        );
    }

    #[test]
    fn malformed_entity_tags_are_rejected() {
        for bad in ["", "\"", "\"a", "\"a\"b\"", "a b", ",", "W/"] {
            assert!(EntityTagCondition::parse(bad).is_err(), "{bad:?}");
        }
    }
}
