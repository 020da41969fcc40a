//! The CQL language: lexer, recursive-descent parser, statement AST, and the typing of
//! literal constants against their receiver types.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod ast;
pub mod lexer;
pub mod literal;
pub mod parser;

pub use parser::{parse, parse_script, SyntaxError};
