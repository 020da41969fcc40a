//! CQL data types shared by every layer of Sluice: the type system, value validation,
//! comparison and formatting, and the Murmur3 token and shard of a partition key.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod cql_type;
pub mod datetime;
pub mod token;
pub mod value;

pub use cql_type::{CqlType, NativeType, TypeParseError};
pub use num_bigint;
pub use token::{murmur3_token, routing_key, routing_key_into, shard_of};
pub use value::{
    canonicalize, compare, contains_set_or_map, format_cql, validate, Value, ValueError,
};
