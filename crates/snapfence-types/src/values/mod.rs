//! Validated scalar values of the contract, one module per kind.

mod grant;
mod idempotency;
mod key;
mod number;
mod page;

pub use grant::{MAX_METADATA_BYTES, MAX_OWNER_BYTES, Metadata, Owner, TtlBounds, TtlMs};
pub use idempotency::{IdempotencyKey, MAX_IDEMPOTENCY_KEY_LEN};
pub use key::{Key, KeyPrefix, MAX_KEY_BYTES, well_escaped};
pub use number::{FencingToken, Version, json_integer, json_integer_opt};
pub use page::{Cursor, PageLimit};

#[cfg(test)]
mod tests {
    use super::*;

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
}
