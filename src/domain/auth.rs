//! API keys: scopes, names, and the bearer secret format `sf_<id>_<secret>`.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{InvalidInput, Key};

/// What a key may do. Each scope includes the ones below it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// `GET` and `HEAD` of leases and snapshots.
    Read,
    /// Everything `read` may, and leases and fenced writes.
    Write,
    /// Everything `write` may, and the audit log.
    Admin,
}

impl Scope {
    /// The name the database stores.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
        }
    }

    /// Parses the stored name.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

/// A key's name: 1..=64 characters of `A-Z a-z 0-9 . _ -`. It is the principal in the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct KeyName(String);

impl KeyName {
    /// Checks a name.
    pub fn parse(raw: impl Into<String>) -> Result<Self, InvalidInput> {
        let raw = raw.into();
        let ok = (1..=64).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ok {
            Ok(Self(raw))
        } else {
            Err(InvalidInput::new(format!(
                "key name {raw:?} must be 1..=64 characters of A-Z a-z 0-9 . _ -"
            )))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A bearer secret as presented: the key's id and its secret part.
pub struct Presented {
    /// The key's id.
    pub id: i64,
    secret: String,
}

impl fmt::Debug for Presented {
    /// Never shows the secret, not even in a debug log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Presented")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

const SECRET_BYTES: usize = 32;

impl Presented {
    /// Parses `sf_<id>_<secret>`.
    pub fn parse(token: &str) -> Option<Self> {
        let rest = token.strip_prefix("sf_")?;
        let (id, secret) = rest.split_once('_')?;
        let id = id.parse().ok().filter(|id: &i64| *id > 0)?;
        let decoded = URL_SAFE_NO_PAD.decode(secret).ok()?;
        (decoded.len() == SECRET_BYTES).then(|| Self {
            id,
            secret: secret.to_owned(),
        })
    }

    /// Whether this secret hashes to `stored`, compared in constant time.
    pub fn matches(&self, stored: &[u8]) -> bool {
        let hash = Sha256::digest(self.secret.as_bytes());
        hash.as_slice().ct_eq(stored).into()
    }
}

/// A newly made secret: the text shown once, and the hash that is stored.
pub struct NewSecret {
    /// The secret part (base64url of 32 random bytes); the bearer token is `sf_<id>_<this>`.
    pub secret: String,
    /// Its SHA-256.
    pub sha256: Vec<u8>,
}

impl NewSecret {
    /// A fresh random secret.
    pub fn generate() -> Self {
        let mut bytes = [0u8; SECRET_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        let secret = URL_SAFE_NO_PAD.encode(bytes);
        let sha256 = Sha256::digest(secret.as_bytes()).to_vec();
        Self { secret, sha256 }
    }

    /// The bearer token of the key with this id.
    pub fn token(&self, id: i64) -> String {
        format!("sf_{id}_{}", self.secret)
    }
}

/// Who made a request, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key's id (its row of `api_keys`), which each changing statement checks is still live.
    pub id: i64,
    /// The key's name.
    pub name: String,
    /// What it may do.
    pub scope: Scope,
    /// The keys it is confined to ('' for all).
    pub prefix: String,
}

impl Principal {
    /// Whether the key may touch `key`.
    pub fn covers(&self, key: &Key) -> bool {
        key.as_str().starts_with(&self.prefix)
    }

    /// Whether the key may list keys under `prefix` (which must lie within its own prefix).
    pub fn covers_prefix(&self, prefix: &str) -> bool {
        prefix.starts_with(&self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_secret_parses_and_matches_its_hash_only() {
        let new = NewSecret::generate();
        let presented = Presented::parse(&new.token(42)).unwrap();
        assert_eq!(presented.id, 42);
        assert!(presented.matches(&new.sha256));
        let other = NewSecret::generate();
        assert!(!presented.matches(&other.sha256));
    }

    /// Timing safety: the SHA-256 of the presented secret is compared, so a caller cannot steer the
    /// compared bytes; constant time is `subtle`'s promise.
    #[test]
    fn secrets_are_compared_by_their_hash_and_every_byte_of_it() {
        let new = NewSecret::generate();
        let presented = Presented::parse(&new.token(1)).unwrap();
        for at in [0, 15, 31] {
            let mut near = new.sha256.clone();
            near[at] ^= 1;
            assert!(!presented.matches(&near), "a hash differing at byte {at}");
        }
        assert!(!presented.matches(&new.sha256[..31]));
        assert!(!presented.matches(&[new.sha256.as_slice(), &[0]].concat()));
        let hash_as_secret = format!("sf_1_{}", URL_SAFE_NO_PAD.encode(&new.sha256));
        let stored_hash_presented = Presented::parse(&hash_as_secret).unwrap();
        assert!(!stored_hash_presented.matches(&new.sha256));
    }

    #[test]
    fn malformed_bearer_tokens_do_not_parse() {
        let good = NewSecret::generate().token(7);
        assert!(Presented::parse(&good).is_some());
        for bad in [
            "",
            "sf_",
            "sf_7",
            "sf_x_abc",
            "sf_0_abc",
            "xx_7_abc",
            &good[..good.len() - 1],
            &format!("{good}A"),
        ] {
            assert!(Presented::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn scopes_are_ordered_read_write_admin() {
        assert!(Scope::Read < Scope::Write && Scope::Write < Scope::Admin);
    }

    #[test]
    fn key_names_are_bounded() {
        assert!(KeyName::parse("ci-runner.1").is_ok());
        assert!(KeyName::parse("").is_err());
        assert!(KeyName::parse("a b").is_err());
        assert!(KeyName::parse("x".repeat(65)).is_err());
    }

    #[test]
    fn the_debug_form_never_shows_the_secret() {
        let token = NewSecret::generate().token(3);
        let shown = format!("{:?}", Presented::parse(&token).unwrap());
        assert!(!shown.contains(&token[5..]), "{shown}");
    }
}
