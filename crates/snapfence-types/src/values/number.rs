//! Numbers of the contract: JSON integers as JSON Schema counts them, fencing tokens, versions.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::InvalidInput;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
