//! The server's vocabulary: the contract's values, records and bodies (the `snapfence-types`
//! crate, shared with the clients and re-exported here), and what only the server knows: API
//! keys, their secrets and scopes ([`Principal`], [`Scope`], …). Every bound of the contract is checked on
//! construction, so that an unchecked string or an out-of-range number never reaches SQL.

mod auth;

pub use auth::{KeyName, NewSecret, Presented, Principal, Scope};
pub use snapfence_types::*;
