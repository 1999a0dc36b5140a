//! What an acquire asks for: the owner, the time to live within the server's bounds, metadata.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::key::control_char;
use crate::InvalidInput;

/// The longest owner, in bytes of UTF-8.
pub const MAX_OWNER_BYTES: usize = 256;
/// The largest lease metadata object, in bytes of its JSON serialization.
pub const MAX_METADATA_BYTES: usize = 4096;

/// Who holds a lease: 1..=256 bytes of UTF-8 without control characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Owner(String);

impl Owner {
    /// Checks an owner name.
    pub fn parse(raw: impl Into<String>) -> Result<Self, InvalidInput> {
        let raw = raw.into();
        if raw.is_empty() || raw.len() > MAX_OWNER_BYTES {
            return Err(InvalidInput::new(format!(
                "owner must be 1..={MAX_OWNER_BYTES} bytes of UTF-8; got {} bytes",
                raw.len()
            )));
        }
        if let Some(c) = control_char(&raw) {
            return Err(InvalidInput::new(format!(
                "owner contains the control character {c:?}"
            )));
        }
        Ok(Self(raw))
    }

    /// The owner as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Owner {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Owner {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<Self, InvalidInput> {
        Self::parse(raw)
    }
}

/// The server's bounds on a lease's time to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlBounds {
    /// The shortest TTL accepted.
    pub min: Duration,
    /// The longest TTL accepted.
    pub max: Duration,
}

impl Default for TtlBounds {
    fn default() -> Self {
        Self {
            min: Duration::from_millis(100),
            max: Duration::from_secs(86_400),
        }
    }
}

/// A lease's time to live in milliseconds, within the server's [`TtlBounds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct TtlMs(i64);

impl TtlMs {
    /// Checks a requested TTL against the bounds.
    pub fn new(ms: i64, bounds: TtlBounds) -> Result<Self, InvalidInput> {
        let (min, max) = (bounds.min.as_millis(), bounds.max.as_millis());
        if ms < 0 || (ms as u128) < min || (ms as u128) > max {
            return Err(InvalidInput::new(format!(
                "ttl_ms {ms} is out of bounds; this server accepts {min}..={max} milliseconds"
            )));
        }
        Ok(Self(ms))
    }

    /// A TTL read back from the database, where it was checked on the way in.
    pub fn from_stored(ms: i64) -> Self {
        Self(ms)
    }

    /// The TTL in milliseconds.
    pub fn get(self) -> i64 {
        self.0
    }

    /// The TTL as a duration.
    pub fn duration(self) -> Duration {
        Duration::from_millis(self.0.unsigned_abs())
    }
}

/// Only the server knows its bounds and it checked them when it granted, so a TTL read from an
/// answer is only checked to be positive.
impl<'de> Deserialize<'de> for TtlMs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match i64::deserialize(d)? {
            ms if ms >= 1 => Ok(Self(ms)),
            ms => Err(serde::de::Error::custom(format!(
                "ttl_ms {ms} is not a positive number of milliseconds"
            ))),
        }
    }
}

/// Lease metadata: a JSON object of at most 4 KiB as serialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Metadata(serde_json::Value);

impl Metadata {
    /// Checks that the value is an object within the size bound.
    pub fn new(value: serde_json::Value) -> Result<Self, InvalidInput> {
        if !value.is_object() {
            return Err(InvalidInput::new(
                "metadata must be a JSON object, e.g. {\"pid\": 4242}",
            ));
        }
        let size = value.to_string().len();
        if size > MAX_METADATA_BYTES {
            return Err(InvalidInput::new(format!(
                "metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES} bytes are allowed"
            )));
        }
        Ok(Self(value))
    }

    /// Metadata read back from the database.
    pub fn from_stored(value: serde_json::Value) -> Self {
        Self(value)
    }

    /// The JSON object.
    pub fn as_json(&self) -> &serde_json::Value {
        &self.0
    }

    /// The object as a header value (`Snapshot-Metadata`): its JSON with every character
    /// outside ASCII escaped, which only strings can hold, so it reads back the same.
    pub fn to_header(&self) -> String {
        let mut ascii = String::new();
        for c in self.0.to_string().chars() {
            // JSON escapes the other control characters itself; DEL it leaves as it is.
            if c.is_ascii() && c != '\x7f' {
                ascii.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    ascii.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
        ascii
    }
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(serde_json::Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_as_a_header_is_ascii_and_reads_back_the_same() {
        let m = Metadata::new(serde_json::json!({"name": "é 𝄞\u{7f}\t", "n": 1})).unwrap();
        let header = m.to_header();
        assert!(
            header.bytes().all(|b| b == b' ' || b.is_ascii_graphic()),
            "{header}"
        );
        let back: serde_json::Value = serde_json::from_str(&header).unwrap();
        assert_eq!(&back, m.as_json());
    }

    #[test]
    fn owner_is_bounded() {
        assert!(Owner::parse("w").is_ok());
        assert!(Owner::parse("w".repeat(256)).is_ok());
        assert!(Owner::parse("").is_err());
        assert!(Owner::parse("w".repeat(257)).is_err());
    }

    #[test]
    fn ttl_respects_bounds() {
        let b = TtlBounds::default();
        assert!(TtlMs::new(100, b).is_ok());
        assert!(TtlMs::new(86_400_000, b).is_ok());
        assert!(TtlMs::new(99, b).is_err());
        assert!(TtlMs::new(86_400_001, b).is_err());
        assert!(TtlMs::new(-5, b).is_err());
    }

    #[test]
    fn metadata_must_be_a_small_object() {
        assert!(Metadata::new(serde_json::json!({"pid": 1})).is_ok());
        assert!(Metadata::new(serde_json::json!([1])).is_err());
        assert!(Metadata::new(serde_json::json!("x")).is_err());
        let big = serde_json::json!({"x": "y".repeat(4096)});
        assert!(Metadata::new(big).is_err());
    }
}
