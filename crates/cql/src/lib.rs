//! The CQL language: lexer, recursive-descent parser, statement AST, and the typing of
//! literal constants against their receiver types.

#![warn(missing_docs)]

pub mod ast;
pub mod lexer;
pub mod literal;
pub mod parser;

pub use parser::{parse, parse_script, SyntaxError};
