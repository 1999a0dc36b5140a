//! Idempotency keys (contract v1.1, after draft-ietf-httpapi-idempotency-key-header).

use std::fmt;

use crate::InvalidInput;

/// The longest idempotency key, in characters (all of them ASCII).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The value of an `Idempotency-Key` header: 1..=255 visible ASCII characters. A changing call
/// sent again with the same key and the same request is answered as the first one was, and
/// changes nothing.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Checks a header value against the contract's rules.
    pub fn parse(raw: impl Into<String>) -> Result<Self, InvalidInput> {
        let raw = raw.into();
        if raw.is_empty() || raw.len() > MAX_IDEMPOTENCY_KEY_LEN {
            return Err(InvalidInput::new(format!(
                "Idempotency-Key is {} characters long; send 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters (a UUID is a good choice)",
                raw.chars().count()
            )));
        }
        if let Some(c) = raw.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(InvalidInput::new(format!(
                "Idempotency-Key contains {c:?}; only visible ASCII characters (no spaces) are allowed"
            )));
        }
        Ok(Self(raw))
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Shown quoted, as the string it is.
impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idempotency_key_is_one_to_255_visible_ascii_characters() {
        assert!(IdempotencyKey::parse("a").is_ok());
        assert!(IdempotencyKey::parse("x".repeat(255)).is_ok());
        assert!(IdempotencyKey::parse("0b1e4c1a-6d5e-4c1e-9d0a-3f4a1b2c3d4e").is_ok());
        assert!(IdempotencyKey::parse("").is_err());
        assert!(IdempotencyKey::parse("x".repeat(256)).is_err());
        assert!(IdempotencyKey::parse("has space").is_err());
        assert!(IdempotencyKey::parse("tab\t").is_err());
        assert!(IdempotencyKey::parse("é").is_err());
    }
}
