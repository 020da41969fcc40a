//! The CQL language: lexer, recursive-descent parser and statement AST.

pub mod ast;
