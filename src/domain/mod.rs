//! The server's vocabulary (`snapfence-types` and API keys), checked on construction so nothing
//! unchecked reaches SQL.

mod auth;

pub use auth::{KeyName, NewSecret, Presented, Principal, Scope};
pub use snapfence_types::*;
