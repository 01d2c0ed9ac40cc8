//! The operator action log: what people and tokens did, its filters
//! (`query`), each entry in words (`words`) and its SQL.

pub mod query;
#[cfg(feature = "ssr")]
pub mod sql;
pub mod words;
