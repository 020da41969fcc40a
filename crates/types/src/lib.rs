//! CQL data types shared by every layer of Sluice: the type system, value validation,
//! comparison and formatting, and the Murmur3 token and shard of a partition key.

pub mod cql_type;

pub use cql_type::{CqlType, NativeType, TypeParseError};
