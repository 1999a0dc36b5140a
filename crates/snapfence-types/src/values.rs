//! Validated scalar values of the contract.

use std::fmt;
use std::time::Duration;

use base64::Engine;
use base64::alphabet::URL_SAFE;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};

use super::InvalidInput;

/// The longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;
/// The longest owner, in bytes of UTF-8.
pub const MAX_OWNER_BYTES: usize = 256;
/// The largest lease metadata object, in bytes of its JSON serialization.
pub const MAX_METADATA_BYTES: usize = 4096;
/// The default page size of every list endpoint.
pub const DEFAULT_PAGE_LIMIT: u32 = 100;
/// The largest page size of every list endpoint.
pub const MAX_PAGE_LIMIT: u32 = 1000;

fn control_char(s: &str) -> Option<char> {
    s.chars().find(|c| c.is_control())
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

/// Reads a JSON integer as JSON Schema counts one: `17` and `17.0` alike (a number with no
/// fractional part), so that a client or a fuzzer that writes integers as floats is understood.
/// Strings, fractions and numbers outside `i64` are refused.
pub fn json_integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    if let Some(i) = n.as_i64() {
        return Ok(i);
    }
    // 2^63 as f64: the first float outside i64.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && (-LIMIT..LIMIT).contains(&f) => Ok(f as i64),
        _ => Err(serde::de::Error::custom(format!(
            "expected an integer, got {n}"
        ))),
    }
}

/// [`json_integer`] for an optional field.
pub fn json_integer_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    struct Integer(#[serde(deserialize_with = "json_integer")] i64);
    Ok(Option::<Integer>::deserialize(d)?.map(|Integer(i)| i))
}

/// A fencing token: 1..=2^63-1, drawn from one Postgres sequence at every grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct FencingToken(i64);

impl FencingToken {
    /// A token from a number, checked to be in range.
    pub fn new(value: i64) -> Result<Self, InvalidInput> {
        if value < 1 {
            return Err(InvalidInput::new(format!(
                "fencing token {value} is out of range; tokens are 1..=9223372036854775807"
            )));
        }
        Ok(Self(value))
    }

    /// A token from the decimal text of a `Fencing-Token` header: digits only, no sign, no
    /// spaces inside, in range.
    pub fn parse_header(raw: &str) -> Result<Self, InvalidInput> {
        let text = raw.trim_matches(|c| c == ' ' || c == '\t');
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(InvalidInput::new(format!(
                "Fencing-Token header {raw:?} is not a decimal integer; send the token from the lease grant, e.g. `Fencing-Token: 17`"
            )));
        }
        let value: i64 = text.parse().map_err(|_| {
            InvalidInput::new(format!(
                "Fencing-Token {text} is out of range; tokens are 1..=9223372036854775807"
            ))
        })?;
        Self::new(value)
    }

    /// The token as stored.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for FencingToken {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = json_integer(d).map_err(|_: D::Error| {
            serde::de::Error::custom("token must be an integer in 1..=9223372036854775807")
        })?;
        Self::new(value).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

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
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(serde_json::Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A snapshot version number: 1, 2, 3… per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Version(i64);

impl Version {
    /// Parses a version from a path segment.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        match raw.parse::<i64>() {
            Ok(v) if v >= 1 => Ok(Self(v)),
            _ => Err(InvalidInput::new(format!(
                "version {raw:?} is not a positive integer"
            ))),
        }
    }

    /// A version read back from the database.
    pub fn from_stored(v: i64) -> Self {
        Self(v)
    }

    /// The version number.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match i64::deserialize(d)? {
            v if v >= 1 => Ok(Self(v)),
            v => Err(serde::de::Error::custom(format!(
                "version {v} is not a positive integer"
            ))),
        }
    }
}

impl std::str::FromStr for Version {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<Self, InvalidInput> {
        Self::parse(raw)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

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
    fn key_accepts_slashes_and_unicode_up_to_512_bytes() {
        assert!(Key::parse("jobs/42").is_ok());
        assert!(Key::parse("é".repeat(256)).is_ok());
        assert!(Key::parse("a".repeat(512)).is_ok());
    }

    #[test]
    fn key_rejects_empty_long_and_control_characters() {
        assert!(Key::parse("").is_err());
        assert!(Key::parse("a".repeat(513)).is_err());
        assert!(Key::parse("a\nb").is_err());
        assert!(Key::parse("a\u{7f}").is_err());
    }

    #[test]
    fn token_header_accepts_the_full_range_only() {
        assert_eq!(FencingToken::parse_header("1").unwrap().get(), 1);
        assert_eq!(
            FencingToken::parse_header("9223372036854775807")
                .unwrap()
                .get(),
            i64::MAX
        );
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1.0",
            "0x10",
            "9223372036854775808",
            "1 2",
            "abc",
        ] {
            assert!(FencingToken::parse_header(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn json_integers_may_be_written_as_floats_without_a_fraction() {
        let read = |text: &str| json_integer(&mut serde_json::Deserializer::from_str(text));
        assert_eq!(read("17").unwrap(), 17);
        assert_eq!(read("17.0").unwrap(), 17);
        assert_eq!(read("-3").unwrap(), -3);
        for bad in ["1.5", "\"17\"", "null", "9223372036854775808", "1e300"] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_integers_written_as_floats_are_read_exactly_up_to_2_pow_53() {
        // Every integer up to 2^53 has an exact float spelling, which a JSON Schema client may
        // send for an integer; a float reader that is off by one ULP turns it into a fraction.
        let read = |text: &str| json_integer(&mut serde_json::Deserializer::from_str(text));
        // 2034349632820803.0 came from schemathesis in CI; the rest are a spread of 15- and
        // 16-digit numbers (a fixed LCG, so a failure names a value that can be tried again).
        // Exact reading is serde_json's `float_roundtrip`; test builds also get it from the
        // dev-dependency jsonschema, so the binary's own build is checked by schemathesis in CI.
        let spread = std::iter::successors(Some(7_u64), |x| {
            Some(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1))
        })
        .map(|x| (x >> 11) as i64)
        .take(200_000);
        for n in [2_034_349_632_820_803, 1 << 52, 1 << 53]
            .into_iter()
            .chain(spread)
        {
            assert_eq!(read(&format!("{n}.0")).ok(), Some(n), "{n}.0");
            assert_eq!(
                read(&format!("{:e}", n as f64)).ok(),
                Some(n),
                "{:e}",
                n as f64
            );
        }
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

    #[test]
    fn page_limit_defaults_and_bounds() {
        assert_eq!(PageLimit::new(None).unwrap().get(), 100);
        assert_eq!(PageLimit::new(Some(1000)).unwrap().get(), 1000);
        assert!(PageLimit::new(Some(0)).is_err());
        assert!(PageLimit::new(Some(1001)).is_err());
    }

    #[test]
    fn values_read_from_an_answer_are_checked() {
        let parse = |json: &str| serde_json::from_str::<Key>(json);
        assert_eq!(parse("\"jobs/42\"").unwrap().as_str(), "jobs/42");
        assert!(parse("\"\"").is_err());
        assert!(serde_json::from_str::<TtlMs>("1").is_ok());
        assert!(serde_json::from_str::<TtlMs>("0").is_err());
        assert!(serde_json::from_str::<Version>("1").is_ok());
        assert!(serde_json::from_str::<Version>("-3").is_err());
        assert_eq!(
            serde_json::to_string(&PageLimit::new(Some(5)).unwrap()).unwrap(),
            "5"
        );
        assert_eq!("7".parse::<PageLimit>().unwrap().get(), 7);
        assert!("0".parse::<PageLimit>().is_err());
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
