//! Pages of the list endpoints: their size and their keyset cursors.

use std::fmt;

use base64::Engine;
use base64::alphabet::URL_SAFE;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};

use crate::InvalidInput;

/// The default page size of every list endpoint.
pub const DEFAULT_PAGE_LIMIT: u32 = 100;
/// The largest page size of every list endpoint.
pub const MAX_PAGE_LIMIT: u32 = 1000;

/// A page size: 1..=1000, 100 when not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct PageLimit(u32);

impl PageLimit {
    /// Checks an optional page size.
    pub fn new(raw: Option<i64>) -> Result<Self, InvalidInput> {
        match raw {
            None => Ok(Self(DEFAULT_PAGE_LIMIT)),
            Some(n) if (1..=i64::from(MAX_PAGE_LIMIT)).contains(&n) => Ok(Self(n as u32)),
            Some(n) => Err(InvalidInput::new(format!(
                "limit {n} is out of range; use 1..={MAX_PAGE_LIMIT}"
            ))),
        }
    }

    /// The page size.
    pub fn get(self) -> i64 {
        i64::from(self.0)
    }
}

impl std::str::FromStr for PageLimit {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<Self, InvalidInput> {
        let n = raw
            .parse()
            .map_err(|_| InvalidInput::new(format!("limit {raw:?} is not an integer")))?;
        Self::new(Some(n))
    }
}

/// A keyset cursor: the position after the last item of a page. Clients pass back what a
/// `next_cursor` gave them. A key position is base64url text (keys may hold any character); an
/// id or version position is its decimal number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor(String);

/// The most digits of a numeric cursor: every 18-digit number fits an `i64`.
const MAX_CURSOR_DIGITS: usize = 18;

impl Cursor {
    /// The cursor that resumes after the key `position`.
    pub fn after(position: &str) -> Self {
        Self(URL_SAFE_NO_PAD.encode(position))
    }

    /// The cursor that resumes after the id or version `position`.
    pub fn after_id(position: i64) -> Self {
        Self(position.to_string())
    }

    /// Decodes a key cursor. Any base64url text is a position (bytes that are not UTF-8 are read
    /// lossily: a page after any position is well defined); other text is refused.
    pub fn decode(raw: &str) -> Result<String, InvalidInput> {
        // Lenient about the unused bits of the last character, so that every text of a valid
        // length (not 1 mod 4) over the alphabet is a position, as openapi.yaml says.
        const LENIENT: GeneralPurpose = GeneralPurpose::new(
            &URL_SAFE,
            GeneralPurposeConfig::new()
                .with_decode_allow_trailing_bits(true)
                .with_decode_padding_mode(DecodePaddingMode::RequireNone),
        );
        LENIENT
            .decode(raw)
            .ok()
            .filter(|bytes| !bytes.is_empty())
            // PostgreSQL text cannot hold NUL. No key holds a control character, so NUL and
            // U+0001 sort every key the same way: the position does not move.
            .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', "\u{1}"))
            .ok_or_else(|| {
                InvalidInput::new("cursor is not base64url text; pass back a next_cursor unchanged")
            })
    }

    /// Decodes an id or version cursor: 1 to 18 decimal digits.
    pub fn decode_number(raw: &str) -> Result<i64, InvalidInput> {
        if raw.is_empty()
            || raw.len() > MAX_CURSOR_DIGITS
            || !raw.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(InvalidInput::new(
                "cursor is not a page position (1 to 18 digits); pass back a next_cursor unchanged",
            ));
        }
        Ok(raw.parse().expect("18 digits fit an i64"))
    }

    /// A cursor exactly as a `next_cursor` gave it, to be passed back unchanged.
    pub fn issued(raw: impl Into<String>) -> Self {
        Self(raw.into())
    }

    /// The encoded cursor.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Cursor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self)
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Cursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_limit_defaults_and_bounds() {
        assert_eq!(PageLimit::new(None).unwrap().get(), 100);
        assert_eq!(PageLimit::new(Some(1000)).unwrap().get(), 1000);
        assert!(PageLimit::new(Some(0)).is_err());
        assert!(PageLimit::new(Some(1001)).is_err());
    }

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let c = Cursor::after("jobs/42");
        assert_eq!(Cursor::decode(c.as_str()).unwrap(), "jobs/42");
        assert_eq!(
            Cursor::decode_number(Cursor::after_id(17).as_str()).unwrap(),
            17
        );
        for bad in ["%%%", "", "0", "abcde"] {
            assert!(Cursor::decode(bad).is_err(), "{bad:?}");
        }
        // Any text of a valid length over the alphabet is a position, and never one that
        // PostgreSQL text cannot hold.
        assert!(Cursor::decode("AB").is_ok());
        assert!(
            !Cursor::decode(&URL_SAFE_NO_PAD.encode(b"a\0b"))
                .unwrap()
                .contains('\0')
        );
        for bad in ["", "x", "-1", "1234567890123456789"] {
            assert!(Cursor::decode_number(bad).is_err(), "{bad:?}");
        }
    }
}
