//! The server's vocabulary: the contract's types from `snapfence-types`, and API keys and scopes.
//! Every bound is checked on construction, so nothing unchecked reaches SQL.

mod auth;

pub use auth::{KeyName, NewSecret, Presented, Principal, Scope};
pub use snapfence_types::*;
