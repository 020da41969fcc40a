//! A recursive-descent CQL parser producing the [`crate::ast`] types.
//!
//! The grammar follows Cassandra 4/5's `Parser.g` plus ScyllaDB's extensions (`USING
//! TIMEOUT`, `BYPASS CACHE`, server-side `DESCRIBE`). Keywords are matched on identifier
//! tokens case-insensitively; only Cassandra's reserved keywords are refused as names, so
//! unreserved ones (`key`, `ttl`, `type`, `count`, `json`, ...) work as column names.

use crate::ast::*;
use crate::lexer::{tokenize, LexError, Token, TokenKind};
use sluice_types::{CqlType, NativeType};
use std::fmt;

/// How deeply terms and types may nest (`[[[...]]]`): a bound on recursion, so hostile
/// input cannot overflow the stack.
pub const MAX_NESTING: usize = 64;

/// A statement that does not parse: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// Byte offset of the offending token in the statement text.
    pub position: usize,
    /// 1-based line of the offending token.
    pub line: usize,
    /// 0-based column (in characters) of the offending token, as Cassandra reports it.
    pub column: usize,
    /// What went wrong (`mismatched input`, `no viable alternative`, ...).
    pub message: &'static str,
    /// What the parser expected there, if one thing.
    pub expected: Option<&'static str>,
    /// The offending token's text (`<EOF>` at the end), at most 64 bytes.
    pub found: String,
    /// The statement around the offending token, which is in brackets:
    /// `SELECT * [FORM] t` (empty for errors of the lexer).
    pub snippet: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}:{} ", self.line, self.column)?;
        match self.expected {
            Some(e) => write!(f, "mismatched input '{}' expecting {e}", self.found)?,
            None => write!(f, "{} at input '{}'", self.message, self.found)?,
        }
        if !self.snippet.is_empty() {
            write!(f, " ({})", self.snippet)?;
        }
        Ok(())
    }
}

impl std::error::Error for SyntaxError {}

impl SyntaxError {
    fn at(
        src: &str,
        start: usize,
        end: usize,
        message: &'static str,
        expected: Option<&'static str>,
    ) -> Self {
        let start = start.min(src.len());
        let before = src.get(..start).unwrap_or("");
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |p| p + 1);
        let column = before.get(line_start..).map_or(0, |l| l.chars().count());
        let found = if start >= src.len() {
            "<EOF>".to_string()
        } else {
            let mut end = end.clamp(start, src.len()).min(start + 64);
            while !src.is_char_boundary(end) {
                end -= 1;
            }
            src.get(start..end).unwrap_or("").to_string()
        };
        SyntaxError {
            position: start,
            line,
            column,
            message,
            expected,
            found,
            snippet: String::new(),
        }
    }

    fn from_lex(src: &str, e: LexError) -> Self {
        SyntaxError::at(src, e.position, e.end, e.message, None)
    }
}

type PResult<T> = Result<T, SyntaxError>;

/// Parses one statement, with an optional trailing `;`.
pub fn parse(text: &str) -> Result<ParsedStatement, SyntaxError> {
    let mut p = Parser::new(text)?;
    let statement = p.statement()?;
    p.eat(TokenKind::Semicolon);
    if p.kind() != TokenKind::Eof {
        return Err(p.err_here("extraneous input", Some("<EOF>")));
    }
    Ok(ParsedStatement {
        statement,
        bind_count: p.binds,
    })
}

/// Parses a script: statements separated by `;` (empty statements are skipped).
pub fn parse_script(text: &str) -> Result<Vec<ParsedStatement>, SyntaxError> {
    let mut p = Parser::new(text)?;
    let mut out = Vec::new();
    loop {
        while p.eat(TokenKind::Semicolon) {}
        if p.kind() == TokenKind::Eof {
            return Ok(out);
        }
        p.binds = 0;
        let statement = p.statement()?;
        if p.kind() != TokenKind::Eof && !p.eat(TokenKind::Semicolon) {
            return Err(p.err_here("missing ';' between statements", Some("';'")));
        }
        out.push(ParsedStatement {
            statement,
            bind_count: p.binds,
        });
    }
}

/// Cassandra's reserved keywords: never identifiers unless double-quoted.
fn is_reserved(word: &str) -> bool {
    let b = word.as_bytes();
    if b.len() < 2 || b.len() > 12 {
        return false;
    }
    let mut buf = [0u8; 12];
    for (d, s) in buf.iter_mut().zip(b) {
        *d = s.to_ascii_lowercase();
    }
    matches!(
        &buf[..b.len()],
        b"add"
            | b"allow"
            | b"alter"
            | b"and"
            | b"apply"
            | b"asc"
            | b"authorize"
            | b"batch"
            | b"begin"
            | b"by"
            | b"columnfamily"
            | b"create"
            | b"delete"
            | b"desc"
            | b"describe"
            | b"drop"
            | b"entries"
            | b"execute"
            | b"from"
            | b"full"
            | b"grant"
            | b"if"
            | b"in"
            | b"index"
            | b"infinity"
            | b"insert"
            | b"into"
            | b"is"
            | b"keyspace"
            | b"limit"
            | b"materialized"
            | b"modify"
            | b"nan"
            | b"norecursive"
            | b"not"
            | b"null"
            | b"of"
            | b"on"
            | b"or"
            | b"order"
            | b"primary"
            | b"rename"
            | b"revoke"
            | b"schema"
            | b"select"
            | b"set"
            | b"table"
            | b"to"
            | b"token"
            | b"truncate"
            | b"unlogged"
            | b"update"
            | b"use"
            | b"using"
            | b"view"
            | b"where"
            | b"with"
    )
}

/// Unescapes a quoted token (`'it''s'` or `"Fo""o"`): strips the quotes, undoubles them.
fn unquote(text: &str, q: char) -> String {
    let inner = text.get(1..text.len().saturating_sub(1)).unwrap_or("");
    if !inner.contains(q) {
        return inner.to_string();
    }
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == q {
            // The lexer only accepts doubled quotes inside; skip the second one.
            chars.next();
        }
    }
    out
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    let mut nibbles = text.bytes().filter(|&b| b != b'-').map(hex_val);
    for byte in &mut out {
        let hi = nibbles.next()??;
        let lo = nibbles.next()??;
        *byte = (hi << 4) | lo;
    }
    nibbles.next().is_none().then_some(out)
}

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token>,
    pos: usize,
    binds: usize,
    depth: usize,
}

const EOF_TOKEN: Token = Token {
    kind: TokenKind::Eof,
    start: 0,
    end: 0,
};

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> PResult<Self> {
        let toks = tokenize(src).map_err(|e| SyntaxError::from_lex(src, e))?;
        Ok(Parser {
            src,
            toks,
            pos: 0,
            binds: 0,
            depth: 0,
        })
    }

    // ---- token access -------------------------------------------------------------

    fn tok_at(&self, n: usize) -> Token {
        self.toks
            .get(self.pos + n)
            .or(self.toks.last())
            .copied()
            .unwrap_or(EOF_TOKEN)
    }

    fn tok(&self) -> Token {
        self.tok_at(0)
    }

    fn kind(&self) -> TokenKind {
        self.tok().kind
    }

    fn kind_at(&self, n: usize) -> TokenKind {
        self.tok_at(n).kind
    }

    fn text(&self) -> &'a str {
        self.tok().text(self.src)
    }

    fn advance(&mut self) -> Token {
        let t = self.tok();
        if self.pos < self.toks.len().saturating_sub(1) {
            self.pos += 1;
        }
        t
    }

    fn eat(&mut self, kind: TokenKind) -> bool {
        if self.kind() == kind {
            self.advance();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, kind: TokenKind, what: &'static str) -> PResult<Token> {
        if self.kind() == kind {
            Ok(self.advance())
        } else {
            Err(self.err_here("mismatched input", Some(what)))
        }
    }

    fn is_kw_at(&self, n: usize, kw: &str) -> bool {
        let t = self.tok_at(n);
        t.kind == TokenKind::Ident && t.text(self.src).eq_ignore_ascii_case(kw)
    }

    fn is_kw(&self, kw: &str) -> bool {
        self.is_kw_at(0, kw)
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        if self.is_kw(kw) {
            self.advance();
            true
        } else {
            false
        }
    }

    /// Expects keyword `kw`; `upper` is how the error names it (`FROM`).
    fn expect_kw(&mut self, kw: &str, upper: &'static str) -> PResult<()> {
        if self.eat_kw(kw) {
            Ok(())
        } else {
            Err(self.err_here("mismatched input", Some(upper)))
        }
    }

    fn err_here(&self, message: &'static str, expected: Option<&'static str>) -> SyntaxError {
        self.err_at(self.tok(), message, expected)
    }

    /// An error at token `t`, with Cassandra's query snippet: up to ten tokens before
    /// it, the token in brackets, two after, and `...` if the text goes on.
    fn err_at(
        &self,
        t: Token,
        message: &'static str,
        expected: Option<&'static str>,
    ) -> SyntaxError {
        let mut e = SyntaxError::at(
            self.src,
            t.start as usize,
            t.end as usize,
            message,
            expected,
        );
        let Ok(idx) = self.toks.binary_search_by_key(&t.start, |k| k.start) else {
            return e;
        };
        // The Eof token is last; `last` is the last real token.
        let last = self.toks.len().saturating_sub(2);
        let first = self
            .toks
            .get(idx.saturating_sub(10))
            .map_or(0, |k| k.start as usize);
        let after_end = self
            .toks
            .get((idx + 2).min(last))
            .filter(|_| idx < last)
            .map_or(t.end as usize, |k| k.end as usize);
        let s = self.src;
        let piece = |a: usize, b: usize| s.get(a..b.max(a)).unwrap_or("");
        let mut snippet = String::with_capacity(after_end.saturating_sub(first) + 8);
        snippet.push_str(piece(first, t.start as usize));
        snippet.push('[');
        snippet.push_str(piece(t.start as usize, t.end as usize));
        snippet.push(']');
        snippet.push_str(piece(t.end as usize, after_end));
        if idx + 2 < last {
            snippet.push_str("...");
        }
        e.snippet = snippet;
        e
    }

    fn no_viable(&self) -> SyntaxError {
        self.err_here("no viable alternative", None)
    }

    /// Enters one nesting level; on failure the depth is unchanged (no `leave` owed).
    fn enter(&mut self) -> PResult<()> {
        if self.depth >= MAX_NESTING {
            return Err(self.err_here("nesting too deep", None));
        }
        self.depth += 1;
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    // ---- names --------------------------------------------------------------------

    /// True if the current token can be an identifier (unreserved word or quoted).
    fn at_ident(&self) -> bool {
        match self.kind() {
            TokenKind::Ident => !is_reserved(self.text()),
            TokenKind::QuotedIdent => true,
            _ => false,
        }
    }

    /// An identifier: unquoted ones fold to lower case, quoted ones keep their case.
    fn ident(&mut self, what: &'static str) -> PResult<String> {
        match self.kind() {
            TokenKind::Ident if !is_reserved(self.text()) => {
                let s = self.text().to_ascii_lowercase();
                self.advance();
                Ok(s)
            }
            TokenKind::QuotedIdent => {
                let s = unquote(self.text(), '"');
                self.advance();
                Ok(s)
            }
            _ => Err(self.err_here("mismatched input", Some(what))),
        }
    }

    /// `[ks.]name`.
    fn qualified_name(&mut self) -> PResult<QualifiedName> {
        let first = self.ident("a table name")?;
        if self.eat(TokenKind::Dot) {
            let name = self.ident("a table name")?;
            Ok(QualifiedName {
                keyspace: Some(first),
                name,
            })
        } else {
            Ok(QualifiedName {
                keyspace: None,
                name: first,
            })
        }
    }

    fn ident_list(&mut self, what: &'static str) -> PResult<Vec<String>> {
        let mut out = vec![self.ident(what)?];
        while self.eat(TokenKind::Comma) {
            out.push(self.ident(what)?);
        }
        Ok(out)
    }

    /// `( a, b, ... )`.
    fn paren_ident_list(&mut self, what: &'static str) -> PResult<Vec<String>> {
        self.expect(TokenKind::LParen, "'('")?;
        let out = self.ident_list(what)?;
        self.expect(TokenKind::RParen, "')'")?;
        Ok(out)
    }

    fn if_not_exists(&mut self) -> PResult<bool> {
        if self.is_kw("if") {
            self.advance();
            self.expect_kw("not", "NOT")?;
            self.expect_kw("exists", "EXISTS")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn if_exists(&mut self) -> PResult<bool> {
        if self.is_kw("if") {
            self.advance();
            self.expect_kw("exists", "EXISTS")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    // ---- statements ---------------------------------------------------------------

    fn statement(&mut self) -> PResult<Statement> {
        if self.kind() != TokenKind::Ident {
            return Err(self.no_viable());
        }
        let t = self.text();
        let kw = |k: &str| t.eq_ignore_ascii_case(k);
        if kw("select") {
            self.select().map(Statement::Select)
        } else if kw("insert") {
            self.insert().map(Statement::Insert)
        } else if kw("update") {
            self.update().map(Statement::Update)
        } else if kw("delete") {
            self.delete().map(Statement::Delete)
        } else if kw("begin") && self.is_kw_at(1, "transaction") {
            self.transaction()
                .map(|t| Statement::Transaction(Box::new(t)))
        } else if kw("begin") {
            self.batch().map(Statement::Batch)
        } else if kw("use") {
            self.advance();
            self.ident("a keyspace name").map(Statement::Use)
        } else if kw("create") {
            self.create()
        } else if kw("alter") {
            self.alter()
        } else if kw("drop") {
            self.drop()
        } else if kw("truncate") {
            self.advance();
            if !self.eat_kw("table") {
                self.eat_kw("columnfamily");
            }
            self.qualified_name().map(Statement::Truncate)
        } else if kw("describe") || kw("desc") {
            self.advance();
            self.describe().map(Statement::Describe)
        } else if kw("grant") {
            self.advance();
            self.grant_or_revoke(true)
        } else if kw("revoke") {
            self.advance();
            self.grant_or_revoke(false)
        } else if kw("list") {
            self.advance();
            self.list()
        } else {
            Err(self.no_viable())
        }
    }

    fn select(&mut self) -> PResult<Select> {
        self.advance(); // SELECT
                        // JSON and DISTINCT are unreserved: `SELECT json FROM t` selects a column.
        let modifier_follows = |p: &Self| {
            !matches!(
                p.kind_at(1),
                TokenKind::Comma | TokenKind::LParen | TokenKind::Dot | TokenKind::LBracket
            ) && !p.is_kw_at(1, "from")
                && !p.is_kw_at(1, "as")
        };
        let json = self.is_kw("json") && modifier_follows(self) && {
            self.advance();
            true
        };
        let distinct = self.is_kw("distinct") && modifier_follows(self) && {
            self.advance();
            true
        };
        let selectors = if self.eat(TokenKind::Star) {
            Vec::new()
        } else {
            let mut v = vec![self.selector_with_alias()?];
            while self.eat(TokenKind::Comma) {
                v.push(self.selector_with_alias()?);
            }
            v
        };
        self.expect_kw("from", "FROM")?;
        let table = self.qualified_name()?;
        let where_clause = self.where_clause()?;
        let mut group_by = Vec::new();
        if self.is_kw("group") {
            self.advance();
            self.expect_kw("by", "BY")?;
            group_by = self.ident_list("a column name")?;
        }
        let mut order_by = Vec::new();
        if self.is_kw("order") {
            self.advance();
            self.expect_kw("by", "BY")?;
            loop {
                let col = self.ident("a column name")?;
                let asc = if self.eat_kw("desc") {
                    false
                } else {
                    self.eat_kw("asc");
                    true
                };
                order_by.push((col, asc));
                if !self.eat(TokenKind::Comma) {
                    break;
                }
            }
        }
        let mut per_partition_limit = None;
        if self.is_kw("per") {
            self.advance();
            self.expect_kw("partition", "PARTITION")?;
            self.expect_kw("limit", "LIMIT")?;
            per_partition_limit = Some(self.term()?);
        }
        let limit = if self.eat_kw("limit") {
            Some(self.term()?)
        } else {
            None
        };
        let allow_filtering = if self.eat_kw("allow") {
            self.expect_kw("filtering", "FILTERING")?;
            true
        } else {
            false
        };
        let bypass_cache = if self.is_kw("bypass") {
            self.advance();
            self.expect_kw("cache", "CACHE")?;
            true
        } else {
            false
        };
        let mut timeout = None;
        if self.eat_kw("using") {
            self.expect_kw("timeout", "TIMEOUT")?;
            timeout = Some(self.term()?);
        }
        Ok(Select {
            json,
            distinct,
            selectors,
            table,
            where_clause,
            group_by,
            order_by,
            per_partition_limit,
            limit,
            allow_filtering,
            bypass_cache,
            timeout,
        })
    }

    fn selector_with_alias(&mut self) -> PResult<Selector> {
        let mut sel = self.selector()?;
        if self.eat_kw("as") {
            let alias = Some(self.ident("an alias")?);
            match &mut sel {
                Selector::Column { alias: a, .. } | Selector::Function { alias: a, .. } => {
                    *a = alias
                }
                Selector::Term(_) => {
                    return Err(self.err_here("an alias on a constant is not supported", None))
                }
            }
        }
        Ok(sel)
    }

    fn selector(&mut self) -> PResult<Selector> {
        self.enter()?;
        let r = self.selector_inner();
        self.leave();
        r
    }

    fn selector_inner(&mut self) -> PResult<Selector> {
        // CAST(x AS type): Cassandra implements it as the function `castAs<type>`.
        if self.is_kw("cast") && self.kind_at(1) == TokenKind::LParen {
            self.advance();
            self.advance();
            let inner = self.selector()?;
            self.expect_kw("as", "AS")?;
            let ty_tok = self.tok();
            let ty = self.cql_type()?;
            let CqlType::Native(native) = ty else {
                return Err(self.err_at(ty_tok, "CAST only converts to native types", None));
            };
            self.expect(TokenKind::RParen, "')'")?;
            return Ok(Selector::Function {
                name: format!("castas{}", native.cql_name()),
                args: vec![inner],
                star: false,
                alias: None,
            });
        }
        let is_call =
            self.kind_at(1) == TokenKind::LParen && (self.at_ident() || self.is_kw("token"));
        if is_call {
            let name = if self.kind() == TokenKind::QuotedIdent {
                unquote(self.text(), '"')
            } else {
                self.text().to_ascii_lowercase()
            };
            self.advance();
            self.advance();
            if self.eat(TokenKind::Star) {
                self.expect(TokenKind::RParen, "')'")?;
                return Ok(Selector::Function {
                    name,
                    args: Vec::new(),
                    star: true,
                    alias: None,
                });
            }
            let mut args = Vec::new();
            if !self.eat(TokenKind::RParen) {
                loop {
                    args.push(self.selector()?);
                    if !self.eat(TokenKind::Comma) {
                        break;
                    }
                }
                self.expect(TokenKind::RParen, "')'")?;
            }
            return Ok(Selector::Function {
                name,
                args,
                star: false,
                alias: None,
            });
        }
        if self.at_ident() && !self.is_term_keyword() {
            let name = self.ident("a column name")?;
            return Ok(Selector::Column { name, alias: None });
        }
        self.term_inner().map(Selector::Term)
    }

    /// True for unreserved words that start a term (`true`, `false`).
    fn is_term_keyword(&self) -> bool {
        self.kind() == TokenKind::Ident && (self.is_kw("true") || self.is_kw("false"))
    }

    fn where_clause(&mut self) -> PResult<Vec<Relation>> {
        let mut out = Vec::new();
        if self.eat_kw("where") {
            out.push(self.relation(false)?);
            while self.eat_kw("and") {
                out.push(self.relation(false)?);
            }
        }
        Ok(out)
    }

    fn comparison(&mut self) -> Option<Operator> {
        let op = match self.kind() {
            TokenKind::Eq => Operator::Eq,
            TokenKind::Neq => Operator::Neq,
            TokenKind::Lt => Operator::Lt,
            TokenKind::Le => Operator::Le,
            TokenKind::Gt => Operator::Gt,
            TokenKind::Ge => Operator::Ge,
            _ => return None,
        };
        self.advance();
        Some(op)
    }

    fn bind_marker(&mut self) -> PResult<BindMarker> {
        let name = if self.eat(TokenKind::Question) {
            None
        } else {
            self.expect(TokenKind::Colon, "a bind marker")?;
            Some(self.ident("a bind marker name")?)
        };
        let index = self.binds;
        self.binds += 1;
        Ok(BindMarker { index, name })
    }

    fn at_marker(&self) -> bool {
        self.kind() == TokenKind::Question || self.kind() == TokenKind::Colon
    }

    /// After `IN`: `?`, `:name`, or `( term, ... )`.
    fn in_rhs(&mut self) -> PResult<RelationRhs> {
        if self.at_marker() {
            return self.bind_marker().map(RelationRhs::InMarker);
        }
        self.expect(TokenKind::LParen, "'('")?;
        let mut items = Vec::new();
        if !self.eat(TokenKind::RParen) {
            loop {
                items.push(self.term()?);
                if !self.eat(TokenKind::Comma) {
                    break;
                }
            }
            self.expect(TokenKind::RParen, "')'")?;
        }
        Ok(RelationRhs::InList(items))
    }

    /// One WHERE relation, or one IF condition when `condition` is set (no token or
    /// multi-column forms there).
    fn relation(&mut self, condition: bool) -> PResult<Relation> {
        if !condition && self.is_kw("token") && self.kind_at(1) == TokenKind::LParen {
            self.advance();
            self.advance();
            let cols = if self.kind() == TokenKind::RParen {
                Vec::new()
            } else {
                self.ident_list("a column name")?
            };
            self.expect(TokenKind::RParen, "')'")?;
            let op = self
                .comparison()
                .ok_or_else(|| self.err_here("mismatched input", Some("a comparison operator")))?;
            let rhs = RelationRhs::Term(self.term()?);
            return Ok(Relation {
                lhs: RelationLhs::Token(cols),
                op,
                rhs,
            });
        }
        if !condition && self.kind() == TokenKind::LParen {
            let cols = self.paren_ident_list("a column name")?;
            let lhs = RelationLhs::Tuple(cols);
            if self.eat_kw("in") {
                let rhs = self.in_rhs()?;
                return Ok(Relation {
                    lhs,
                    op: Operator::In,
                    rhs,
                });
            }
            let op = self
                .comparison()
                .ok_or_else(|| self.err_here("mismatched input", Some("a comparison operator")))?;
            let rhs = RelationRhs::Term(self.term()?);
            return Ok(Relation { lhs, op, rhs });
        }
        let column = self.ident("a column name")?;
        let lhs = if self.eat(TokenKind::LBracket) {
            let key = self.term()?;
            self.expect(TokenKind::RBracket, "']'")?;
            RelationLhs::Element(column, key)
        } else {
            RelationLhs::Column(column)
        };
        if self.eat_kw("in") {
            let rhs = self.in_rhs()?;
            return Ok(Relation {
                lhs,
                op: Operator::In,
                rhs,
            });
        }
        let op = if self.eat_kw("contains") {
            if self.eat_kw("key") {
                Operator::ContainsKey
            } else {
                Operator::Contains
            }
        } else if self.eat_kw("like") {
            Operator::Like
        } else {
            self.comparison()
                .ok_or_else(|| self.err_here("no viable alternative", None))?
        };
        let rhs = RelationRhs::Term(self.term()?);
        Ok(Relation { lhs, op, rhs })
    }

    fn insert(&mut self) -> PResult<Insert> {
        self.advance(); // INSERT
        self.expect_kw("into", "INTO")?;
        let table = self.qualified_name()?;
        let (columns, values, json) = if self.is_kw("json") {
            self.advance();
            let v = self.term()?;
            if self.eat_kw("default") {
                if self.eat_kw("unset") {
                    return Err(self.err_here("DEFAULT UNSET is not supported", None));
                }
                self.expect_kw("null", "NULL or UNSET")?;
            }
            (Vec::new(), vec![v], true)
        } else {
            let open = self.tok();
            let columns = self.paren_ident_list("a column name")?;
            self.expect_kw("values", "VALUES")?;
            self.expect(TokenKind::LParen, "'('")?;
            let mut values = vec![self.term()?];
            while self.eat(TokenKind::Comma) {
                values.push(self.term()?);
            }
            self.expect(TokenKind::RParen, "')'")?;
            if values.len() != columns.len() {
                return Err(self.err_at(open, "Unmatched column names/values", None));
            }
            (columns, values, false)
        };
        let mut using = Using::default();
        let mut if_not_exists = false;
        let mut seen_using = false;
        // Cassandra wants IF NOT EXISTS before USING; accept either order, each once.
        for _ in 0..2 {
            if !if_not_exists && self.is_kw("if") {
                if_not_exists = self.if_not_exists()?;
            } else if !seen_using && self.eat_kw("using") {
                seen_using = true;
                self.using_clause(&mut using)?;
            }
        }
        Ok(Insert {
            table,
            columns,
            values,
            json,
            if_not_exists,
            using,
        })
    }

    /// `TTL t | TIMESTAMP t | TIMEOUT t` joined by AND (after USING).
    fn using_clause(&mut self, using: &mut Using) -> PResult<()> {
        loop {
            let which = if self.is_kw("ttl") {
                0
            } else if self.is_kw("timestamp") {
                1
            } else if self.is_kw("timeout") {
                2
            } else {
                return Err(self.err_here("mismatched input", Some("TTL, TIMESTAMP or TIMEOUT")));
            };
            let repeated = match which {
                0 => using.ttl.is_some(),
                1 => using.timestamp.is_some(),
                _ => using.timeout.is_some(),
            };
            if repeated {
                return Err(self.err_here("repeated USING parameter", None));
            }
            self.advance();
            let t = Some(self.term()?);
            match which {
                0 => using.ttl = t,
                1 => using.timestamp = t,
                _ => using.timeout = t,
            }
            if !self.eat_kw("and") {
                return Ok(());
            }
        }
    }

    fn update(&mut self) -> PResult<Update> {
        self.advance(); // UPDATE
        let table = self.qualified_name()?;
        let mut using = Using::default();
        if self.eat_kw("using") {
            self.using_clause(&mut using)?;
        }
        self.expect_kw("set", "SET")?;
        let mut assignments = vec![self.assignment()?];
        while self.eat(TokenKind::Comma) {
            assignments.push(self.assignment()?);
        }
        let where_clause = self.where_clause()?;
        if where_clause.is_empty() {
            return Err(self.err_here("mismatched input", Some("WHERE")));
        }
        let condition = self.condition(false)?;
        Ok(Update {
            table,
            using,
            assignments,
            where_clause,
            condition,
        })
    }

    /// True if the current token is an identifier naming `column`.
    fn at_column(&self, column: &str) -> bool {
        match self.kind() {
            TokenKind::Ident => {
                !is_reserved(self.text())
                    && self.text().eq_ignore_ascii_case(column)
                    && column.bytes().all(|b| !b.is_ascii_uppercase())
            }
            TokenKind::QuotedIdent => unquote(self.text(), '"') == column,
            _ => false,
        }
    }

    fn assignment(&mut self) -> PResult<Assignment> {
        let column = self.ident("a column name")?;
        if self.eat(TokenKind::LBracket) {
            let key = self.term()?;
            self.expect(TokenKind::RBracket, "']'")?;
            self.expect(TokenKind::Eq, "'='")?;
            let value = self.term()?;
            return Ok(Assignment::SetElement { column, key, value });
        }
        // `c += t` / `c -= t` (Cassandra 4).
        if self.kind_at(1) == TokenKind::Eq
            && matches!(self.kind(), TokenKind::Plus | TokenKind::Minus)
        {
            let add = self.kind() == TokenKind::Plus;
            self.advance();
            self.advance();
            let value = self.term()?;
            return Ok(if add {
                Assignment::Add { column, value }
            } else {
                Assignment::Subtract { column, value }
            });
        }
        self.expect(TokenKind::Eq, "'='")?;
        if self.at_column(&column) {
            match self.kind_at(1) {
                TokenKind::Plus => {
                    self.advance();
                    self.advance();
                    let value = self.term()?;
                    return Ok(Assignment::Add { column, value });
                }
                TokenKind::Minus => {
                    self.advance();
                    self.advance();
                    let value = self.term()?;
                    return Ok(Assignment::Subtract { column, value });
                }
                // `c = c -1`: the lexer glued the minus to the number, as Cassandra's does.
                TokenKind::Integer | TokenKind::Float
                    if self.tok_at(1).text(self.src).starts_with('-') =>
                {
                    self.advance();
                    let t = self.advance();
                    let text = t.text(self.src).get(1..).unwrap_or("").to_string();
                    let lit = if t.kind == TokenKind::Integer {
                        Literal::Integer(text)
                    } else {
                        Literal::Float(text)
                    };
                    return Ok(Assignment::Subtract {
                        column,
                        value: Term::Literal(lit),
                    });
                }
                _ => {}
            }
        }
        if self.at_ident()
            && !self.is_term_keyword()
            && matches!(self.kind_at(1), TokenKind::Plus | TokenKind::Minus)
        {
            return Err(self.err_here(
                "Only expressions of the form X = X + <value> are supported",
                None,
            ));
        }
        let value = self.term()?;
        if self.kind() == TokenKind::Plus && {
            let save = self.pos;
            self.advance();
            let ok = self.at_column(&column);
            self.pos = save;
            ok
        } {
            self.advance();
            self.advance();
            return Ok(Assignment::Prepend { column, value });
        }
        Ok(Assignment::Set { column, value })
    }

    /// `IF EXISTS`, `IF NOT EXISTS` (when `allow_not_exists`) or `IF cond AND ...`.
    fn condition(&mut self, allow_not_exists: bool) -> PResult<Option<Condition>> {
        if !self.eat_kw("if") {
            return Ok(None);
        }
        if self.eat_kw("exists") {
            return Ok(Some(Condition::Exists));
        }
        if allow_not_exists && self.is_kw("not") {
            self.advance();
            self.expect_kw("exists", "EXISTS")?;
            return Ok(Some(Condition::NotExists));
        }
        let mut conds = vec![self.relation(true)?];
        while self.eat_kw("and") {
            conds.push(self.relation(true)?);
        }
        Ok(Some(Condition::Columns(conds)))
    }

    fn delete(&mut self) -> PResult<Delete> {
        self.advance(); // DELETE
        let mut targets = Vec::new();
        if !self.is_kw("from") {
            loop {
                let column = self.ident("a column name")?;
                let element = if self.eat(TokenKind::LBracket) {
                    let t = self.term()?;
                    self.expect(TokenKind::RBracket, "']'")?;
                    Some(t)
                } else {
                    None
                };
                targets.push(DeleteTarget { column, element });
                if !self.eat(TokenKind::Comma) {
                    break;
                }
            }
        }
        self.expect_kw("from", "FROM")?;
        let table = self.qualified_name()?;
        let mut using = Using::default();
        if self.eat_kw("using") {
            self.using_clause(&mut using)?;
        }
        let where_clause = self.where_clause()?;
        if where_clause.is_empty() {
            return Err(self.err_here("mismatched input", Some("WHERE")));
        }
        let condition = self.condition(false)?;
        Ok(Delete {
            targets,
            table,
            using,
            where_clause,
            condition,
        })
    }

    fn batch(&mut self) -> PResult<Batch> {
        self.advance(); // BEGIN
        let kind = if self.eat_kw("unlogged") {
            BatchKind::Unlogged
        } else if self.eat_kw("counter") {
            BatchKind::Counter
        } else {
            BatchKind::Logged
        };
        self.expect_kw("batch", "BATCH")?;
        let mut using = Using::default();
        if self.eat_kw("using") {
            self.using_clause(&mut using)?;
        }
        let mut statements = Vec::new();
        loop {
            if self.is_kw("apply") {
                self.advance();
                self.expect_kw("batch", "BATCH")?;
                break;
            }
            let st = if self.is_kw("insert") {
                BatchStatement::Insert(self.insert()?)
            } else if self.is_kw("update") {
                BatchStatement::Update(self.update()?)
            } else if self.is_kw("delete") {
                BatchStatement::Delete(self.delete()?)
            } else {
                return Err(self.err_here(
                    "mismatched input",
                    Some("INSERT, UPDATE, DELETE or APPLY BATCH"),
                ));
            };
            statements.push(st);
            self.eat(TokenKind::Semicolon);
        }
        Ok(Batch {
            kind,
            using,
            statements,
        })
    }

    // ---- terms --------------------------------------------------------------------

    /// A value expression.
    fn term(&mut self) -> PResult<Term> {
        self.enter()?;
        let r = self.term_inner();
        self.leave();
        r
    }

    fn term_inner(&mut self) -> PResult<Term> {
        let t = self.tok();
        let text = t.text(self.src);
        let lit = |l: Literal| Ok(Term::Literal(l));
        match t.kind {
            TokenKind::String => {
                self.advance();
                lit(Literal::String(unquote(text, '\'')))
            }
            TokenKind::DollarString => {
                self.advance();
                lit(Literal::String(
                    text.get(2..text.len().saturating_sub(2))
                        .unwrap_or("")
                        .to_string(),
                ))
            }
            TokenKind::Integer => {
                self.advance();
                lit(Literal::Integer(text.to_string()))
            }
            TokenKind::Float => {
                self.advance();
                lit(Literal::Float(text.to_string()))
            }
            TokenKind::Duration => {
                self.advance();
                lit(Literal::Duration(text.to_string()))
            }
            TokenKind::Hex => {
                let digits = text.get(2..).unwrap_or("").as_bytes();
                if digits.len() % 2 != 0 {
                    return Err(self.err_here("odd number of digits in a blob literal", None));
                }
                let mut blob = Vec::with_capacity(digits.len() / 2);
                for pair in digits.chunks_exact(2) {
                    match (hex_val(pair[0]), hex_val(pair[1])) {
                        (Some(h), Some(l)) => blob.push((h << 4) | l),
                        _ => return Err(self.err_here("invalid blob literal", None)),
                    }
                }
                self.advance();
                lit(Literal::Blob(blob))
            }
            TokenKind::Uuid => {
                let u =
                    parse_uuid(text).ok_or_else(|| self.err_here("invalid UUID literal", None))?;
                self.advance();
                lit(Literal::Uuid(u))
            }
            TokenKind::Question | TokenKind::Colon => self.bind_marker().map(Term::Bind),
            TokenKind::LBracket => {
                self.advance();
                let items = self.term_list(TokenKind::RBracket, "']'")?;
                Ok(Term::List(items))
            }
            TokenKind::LBrace => self.brace_term(),
            TokenKind::LParen => {
                if self.type_follows(1) && {
                    // `(type) term` when the parenthesis closes right after the type.
                    let save = self.pos;
                    self.advance();
                    let ok = self.cql_type().is_ok() && self.kind() == TokenKind::RParen;
                    self.pos = save;
                    ok
                } {
                    self.advance();
                    let ty = self.cql_type()?;
                    self.expect(TokenKind::RParen, "')'")?;
                    let inner = self.term()?;
                    return Ok(Term::Cast(ty, Box::new(inner)));
                }
                self.advance();
                let items = self.term_list(TokenKind::RParen, "')'")?;
                if items.is_empty() {
                    return Err(self.err_here("empty tuple", None));
                }
                Ok(Term::Tuple(items))
            }
            TokenKind::Minus => {
                if self.is_kw_at(1, "infinity") || self.is_kw_at(1, "nan") {
                    self.advance();
                    let word = self.advance().text(self.src);
                    let v = if word.eq_ignore_ascii_case("nan") {
                        "NaN"
                    } else {
                        "-Infinity"
                    };
                    return lit(Literal::Float(v.to_string()));
                }
                Err(self.no_viable())
            }
            TokenKind::Ident => {
                if self.eat_kw("true") {
                    return lit(Literal::Bool(true));
                }
                if self.eat_kw("false") {
                    return lit(Literal::Bool(false));
                }
                if self.eat_kw("null") {
                    return lit(Literal::Null);
                }
                if self.eat_kw("nan") {
                    return lit(Literal::Float("NaN".to_string()));
                }
                if self.eat_kw("infinity") {
                    return lit(Literal::Float("Infinity".to_string()));
                }
                if self.kind_at(1) == TokenKind::LParen
                    && (!is_reserved(text) || self.is_kw("token"))
                {
                    return self.function_term();
                }
                // `row.column`: a transaction's LET reference.
                if self.kind_at(1) == TokenKind::Dot
                    && matches!(self.kind_at(2), TokenKind::Ident | TokenKind::QuotedIdent)
                    && self.kind_at(3) != TokenKind::LParen
                    && !is_reserved(text)
                {
                    let row = self.ident("a LET name")?;
                    self.advance();
                    let column = self.ident("a column name")?;
                    return Ok(Term::Reference(RowReference {
                        row,
                        column: Some(column),
                    }));
                }
                // `system.now()`: a keyspace-qualified function.
                if self.kind_at(1) == TokenKind::Dot
                    && self.kind_at(2) == TokenKind::Ident
                    && self.kind_at(3) == TokenKind::LParen
                {
                    self.advance();
                    self.advance();
                    return self.function_term();
                }
                Err(self.no_viable())
            }
            TokenKind::QuotedIdent if self.kind_at(1) == TokenKind::LParen => self.function_term(),
            _ => Err(self.no_viable()),
        }
    }

    fn function_term(&mut self) -> PResult<Term> {
        let name = if self.kind() == TokenKind::QuotedIdent {
            unquote(self.text(), '"')
        } else {
            self.text().to_ascii_lowercase()
        };
        self.advance();
        self.advance(); // (
        let args = self.term_list(TokenKind::RParen, "')'")?;
        Ok(Term::Function { name, args })
    }

    /// `term, term, ... close` (possibly empty), consuming `close`.
    fn term_list(&mut self, close: TokenKind, what: &'static str) -> PResult<Vec<Term>> {
        let mut items = Vec::new();
        if self.eat(close) {
            return Ok(items);
        }
        loop {
            items.push(self.term()?);
            if !self.eat(TokenKind::Comma) {
                break;
            }
        }
        self.expect(close, what)?;
        Ok(items)
    }

    /// `{}`, `{a, b}` or `{k: v, ...}`.
    fn brace_term(&mut self) -> PResult<Term> {
        self.advance(); // {
        if self.eat(TokenKind::RBrace) {
            return Ok(Term::Set(Vec::new()));
        }
        let first = self.term()?;
        if self.eat(TokenKind::Colon) {
            let mut entries = vec![(first, self.term()?)];
            while self.eat(TokenKind::Comma) {
                let k = self.term()?;
                self.expect(TokenKind::Colon, "':'")?;
                entries.push((k, self.term()?));
            }
            self.expect(TokenKind::RBrace, "'}'")?;
            return Ok(Term::Map(entries));
        }
        let mut items = vec![first];
        while self.eat(TokenKind::Comma) {
            items.push(self.term()?);
        }
        self.expect(TokenKind::RBrace, "'}'")?;
        Ok(Term::Set(items))
    }

    // ---- types --------------------------------------------------------------------

    /// True if the token `n` ahead starts a type (a native name or a collection/tuple).
    fn type_follows(&self, n: usize) -> bool {
        let t = self.tok_at(n);
        if t.kind != TokenKind::Ident {
            return false;
        }
        let w = t.text(self.src);
        NativeType::from_name(w).is_some()
            || ["frozen", "list", "set", "map", "tuple"]
                .iter()
                .any(|k| w.eq_ignore_ascii_case(k))
    }

    fn cql_type(&mut self) -> PResult<CqlType> {
        self.enter()?;
        let r = self.cql_type_inner();
        self.leave();
        r
    }

    fn cql_type_inner(&mut self) -> PResult<CqlType> {
        if self.kind() != TokenKind::Ident {
            return Err(self.err_here("mismatched input", Some("a type")));
        }
        let word = self.text();
        let lower = |k: &str| word.eq_ignore_ascii_case(k);
        if lower("frozen") || lower("list") || lower("set") {
            let which = word.to_ascii_lowercase();
            self.advance();
            self.expect(TokenKind::Lt, "'<'")?;
            let inner = Box::new(self.cql_type()?);
            self.expect(TokenKind::Gt, "'>'")?;
            return Ok(match which.as_str() {
                "frozen" => CqlType::Frozen(inner),
                "list" => CqlType::List(inner),
                _ => CqlType::Set(inner),
            });
        }
        if lower("map") {
            self.advance();
            self.expect(TokenKind::Lt, "'<'")?;
            let k = self.cql_type()?;
            self.expect(TokenKind::Comma, "','")?;
            let v = self.cql_type()?;
            self.expect(TokenKind::Gt, "'>'")?;
            return Ok(CqlType::Map(Box::new(k), Box::new(v)));
        }
        if lower("tuple") {
            self.advance();
            self.expect(TokenKind::Lt, "'<'")?;
            let mut items = vec![self.cql_type()?];
            while self.eat(TokenKind::Comma) {
                items.push(self.cql_type()?);
            }
            self.expect(TokenKind::Gt, "'>'")?;
            return Ok(CqlType::Tuple(items));
        }
        match NativeType::from_name(word) {
            Some(t) => {
                self.advance();
                Ok(CqlType::Native(t))
            }
            None => Err(self.err_here("unknown type (user-defined types are not supported)", None)),
        }
    }

    // ---- DDL ----------------------------------------------------------------------

    fn create(&mut self) -> PResult<Statement> {
        self.advance(); // CREATE
        if self.eat_kw("keyspace") || self.eat_kw("schema") {
            let if_not_exists = self.if_not_exists()?;
            let name = self.ident("a keyspace name")?;
            self.expect_kw("with", "WITH")?;
            let properties = self.properties()?;
            return Ok(Statement::CreateKeyspace(CreateKeyspace {
                name,
                if_not_exists,
                properties,
            }));
        }
        if self.eat_kw("table") || self.eat_kw("columnfamily") {
            return self.create_table().map(Statement::CreateTable);
        }
        if self.eat_kw("role") {
            let if_not_exists = self.if_not_exists()?;
            let name = self.role_name()?;
            let options = self.role_options()?;
            return Ok(Statement::CreateRole(CreateRole {
                name,
                if_not_exists,
                options,
                user_syntax: false,
            }));
        }
        if self.eat_kw("user") {
            let if_not_exists = self.if_not_exists()?;
            let name = self.role_name()?;
            let mut options = self.user_options()?;
            options.login = Some(true);
            options.superuser.get_or_insert(false);
            return Ok(Statement::CreateRole(CreateRole {
                name,
                if_not_exists,
                options,
                user_syntax: true,
            }));
        }
        Err(self.err_here("mismatched input", Some("KEYSPACE, TABLE, ROLE or USER")))
    }

    fn create_table(&mut self) -> PResult<CreateTable> {
        let if_not_exists = self.if_not_exists()?;
        let name = self.qualified_name()?;
        self.expect(TokenKind::LParen, "'('")?;
        let mut columns = Vec::new();
        let mut key: Option<(Vec<String>, Vec<String>)> = None;
        loop {
            if self.is_kw("primary") {
                let at = self.tok();
                self.advance();
                self.expect_kw("key", "KEY")?;
                self.expect(TokenKind::LParen, "'('")?;
                let partition = if self.eat(TokenKind::LParen) {
                    let p = self.ident_list("a column name")?;
                    self.expect(TokenKind::RParen, "')'")?;
                    p
                } else {
                    vec![self.ident("a column name")?]
                };
                let mut clustering = Vec::new();
                while self.eat(TokenKind::Comma) {
                    clustering.push(self.ident("a column name")?);
                }
                self.expect(TokenKind::RParen, "')'")?;
                if key.is_some() {
                    return Err(self.err_at(at, "Multiple PRIMARY KEYs specified", None));
                }
                key = Some((partition, clustering));
            } else {
                let col_name = self.ident("a column name")?;
                let ty = self.cql_type()?;
                let is_static = self.eat_kw("static");
                let primary_key = if self.is_kw("primary") {
                    let at = self.tok();
                    self.advance();
                    self.expect_kw("key", "KEY")?;
                    if key.is_some() {
                        return Err(self.err_at(at, "Multiple PRIMARY KEYs specified", None));
                    }
                    key = Some((vec![col_name.clone()], Vec::new()));
                    true
                } else {
                    false
                };
                columns.push(ColumnDefinition {
                    name: col_name,
                    ty,
                    is_static,
                    primary_key,
                });
            }
            if !self.eat(TokenKind::Comma) {
                break;
            }
            // Tolerate a trailing comma before the closing parenthesis.
            if self.kind() == TokenKind::RParen {
                break;
            }
        }
        self.expect(TokenKind::RParen, "')'")?;
        let Some((partition_key, clustering_key)) = key else {
            return Err(self.err_here("No PRIMARY KEY specified", None));
        };
        let mut ct = CreateTable {
            name,
            if_not_exists,
            columns,
            partition_key,
            clustering_key,
            clustering_order: Vec::new(),
            compact_storage: false,
            properties: Vec::new(),
        };
        if self.eat_kw("with") {
            loop {
                if self.is_kw("compact") {
                    self.advance();
                    self.expect_kw("storage", "STORAGE")?;
                    ct.compact_storage = true;
                } else if self.is_kw("clustering") && self.is_kw_at(1, "order") {
                    self.advance();
                    self.advance();
                    self.expect_kw("by", "BY")?;
                    self.expect(TokenKind::LParen, "'('")?;
                    loop {
                        let c = self.ident("a column name")?;
                        let asc = if self.eat_kw("desc") {
                            false
                        } else {
                            self.eat_kw("asc");
                            true
                        };
                        ct.clustering_order.push((c, asc));
                        if !self.eat(TokenKind::Comma) {
                            break;
                        }
                    }
                    self.expect(TokenKind::RParen, "')'")?;
                } else {
                    ct.properties.push(self.property()?);
                }
                if !self.eat_kw("and") {
                    break;
                }
            }
        }
        Ok(ct)
    }

    fn properties(&mut self) -> PResult<Vec<Property>> {
        let mut out = vec![self.property()?];
        while self.eat_kw("and") {
            out.push(self.property()?);
        }
        Ok(out)
    }

    fn property(&mut self) -> PResult<Property> {
        let name = self.ident("a property name")?;
        self.expect(TokenKind::Eq, "'='")?;
        let value = self.option_value()?;
        Ok(Property { name, value })
    }

    fn option_value(&mut self) -> PResult<OptionValue> {
        let t = self.tok();
        let text = t.text(self.src);
        let v = match t.kind {
            TokenKind::String => OptionValue::String(unquote(text, '\'')),
            TokenKind::DollarString => OptionValue::String(
                text.get(2..text.len().saturating_sub(2))
                    .unwrap_or("")
                    .to_string(),
            ),
            TokenKind::Integer | TokenKind::Float => OptionValue::Number(text.to_string()),
            // `WITH ID = <uuid>` (DESCRIBE ... WITH INTERNALS output) and blob-valued
            // extension maps: kept as written.
            TokenKind::Uuid | TokenKind::Hex => OptionValue::String(text.to_string()),
            TokenKind::Ident if text.eq_ignore_ascii_case("true") => OptionValue::Bool(true),
            TokenKind::Ident if text.eq_ignore_ascii_case("false") => OptionValue::Bool(false),
            TokenKind::Ident | TokenKind::QuotedIdent => {
                OptionValue::Identifier(self.ident("a value")?)
            }
            TokenKind::LBrace => {
                self.enter()?;
                let r = self.option_map();
                self.leave();
                return r;
            }
            _ => return Err(self.err_here("mismatched input", Some("a constant or a map"))),
        };
        if !matches!(v, OptionValue::Identifier(_)) {
            self.advance();
        }
        Ok(v)
    }

    fn option_map(&mut self) -> PResult<OptionValue> {
        self.advance(); // {
        let mut entries = Vec::new();
        if !self.eat(TokenKind::RBrace) {
            loop {
                let key = match self.kind() {
                    TokenKind::String => unquote(self.text(), '\''),
                    TokenKind::QuotedIdent => unquote(self.text(), '"'),
                    TokenKind::Ident | TokenKind::Integer => {
                        // Cassandra only takes constants here; bare words are accepted as text.
                        self.text().to_string()
                    }
                    _ => return Err(self.err_here("mismatched input", Some("a string key"))),
                };
                self.advance();
                self.expect(TokenKind::Colon, "':'")?;
                let v = self.option_value()?;
                entries.push((key, v));
                if !self.eat(TokenKind::Comma) {
                    break;
                }
            }
            self.expect(TokenKind::RBrace, "'}'")?;
        }
        Ok(OptionValue::Map(entries))
    }

    fn alter(&mut self) -> PResult<Statement> {
        self.advance(); // ALTER
        if self.eat_kw("keyspace") || self.eat_kw("schema") {
            let if_exists = self.if_exists()?;
            let name = self.ident("a keyspace name")?;
            self.expect_kw("with", "WITH")?;
            let properties = self.properties()?;
            return Ok(Statement::AlterKeyspace(AlterKeyspace {
                name,
                if_exists,
                properties,
            }));
        }
        if self.eat_kw("role") || self.eat_kw("user") {
            let user = self.previous_is_kw("user");
            let if_exists = self.if_exists()?;
            let name = self.role_name()?;
            let options = if user {
                self.user_options()?
            } else {
                self.role_options()?
            };
            return Ok(Statement::AlterRole(AlterRole {
                name,
                if_exists,
                options,
            }));
        }
        if !(self.eat_kw("table") || self.eat_kw("columnfamily")) {
            return Err(self.err_here("mismatched input", Some("KEYSPACE, TABLE, ROLE or USER")));
        }
        let if_exists = self.if_exists()?;
        let name = self.qualified_name()?;
        let action = if self.eat_kw("add") {
            let paren = self.eat(TokenKind::LParen);
            let mut cols = vec![self.added_column()?];
            while self.eat(TokenKind::Comma) {
                cols.push(self.added_column()?);
            }
            if paren {
                self.expect(TokenKind::RParen, "')'")?;
            }
            AlterTableAction::Add(cols)
        } else if self.eat_kw("drop") {
            let cols = if self.kind() == TokenKind::LParen {
                self.paren_ident_list("a column name")?
            } else {
                self.ident_list("a column name")?
            };
            AlterTableAction::Drop(cols)
        } else if self.eat_kw("rename") {
            let mut renames = Vec::new();
            loop {
                let from = self.ident("a column name")?;
                self.expect_kw("to", "TO")?;
                let to = self.ident("a column name")?;
                renames.push((from, to));
                if !self.eat_kw("and") {
                    break;
                }
            }
            AlterTableAction::Rename(renames)
        } else if self.eat_kw("alter") {
            let col = self.ident("a column name")?;
            self.expect_kw("type", "TYPE")?;
            AlterTableAction::AlterType(col, self.cql_type()?)
        } else if self.eat_kw("with") {
            AlterTableAction::With(self.properties()?)
        } else {
            return Err(self.err_here("mismatched input", Some("ADD, DROP, RENAME, ALTER or WITH")));
        };
        Ok(Statement::AlterTable(AlterTable {
            name,
            if_exists,
            action,
        }))
    }

    fn added_column(&mut self) -> PResult<ColumnDefinition> {
        let name = self.ident("a column name")?;
        let ty = self.cql_type()?;
        let is_static = self.eat_kw("static");
        Ok(ColumnDefinition {
            name,
            ty,
            is_static,
            primary_key: false,
        })
    }

    fn drop(&mut self) -> PResult<Statement> {
        self.advance(); // DROP
        if self.eat_kw("keyspace") || self.eat_kw("schema") {
            let if_exists = self.if_exists()?;
            let name = self.ident("a keyspace name")?;
            return Ok(Statement::DropKeyspace(Drop {
                name: QualifiedName {
                    keyspace: None,
                    name,
                },
                if_exists,
            }));
        }
        if self.eat_kw("table") || self.eat_kw("columnfamily") {
            let if_exists = self.if_exists()?;
            let name = self.qualified_name()?;
            return Ok(Statement::DropTable(Drop { name, if_exists }));
        }
        if self.eat_kw("role") || self.eat_kw("user") {
            let if_exists = self.if_exists()?;
            let name = self.role_name()?;
            return Ok(Statement::DropRole(DropRole { name, if_exists }));
        }
        Err(self.err_here("mismatched input", Some("KEYSPACE, TABLE, ROLE or USER")))
    }

    // ---- roles and permissions ----------------------------------------------------

    /// True if the token just consumed is the keyword `kw`.
    fn previous_is_kw(&self, kw: &str) -> bool {
        self.pos > 0
            && self.toks.get(self.pos - 1).is_some_and(|t| {
                t.kind == TokenKind::Ident && t.text(self.src).eq_ignore_ascii_case(kw)
            })
    }

    /// A role or user name: an unreserved identifier (lower-cased), a quoted identifier or
    /// a string constant (both kept as written), as Cassandra's `userOrRoleName`.
    fn role_name(&mut self) -> PResult<String> {
        match self.kind() {
            TokenKind::String => {
                let s = unquote(self.text(), '\'');
                self.advance();
                Ok(s)
            }
            _ => self.ident("a role name"),
        }
    }

    /// A string constant (`'...'` or `$$...$$`).
    fn string_constant(&mut self, what: &'static str) -> PResult<String> {
        let text = self.text();
        let s = match self.kind() {
            TokenKind::String => unquote(text, '\''),
            TokenKind::DollarString => text
                .get(2..text.len().saturating_sub(2))
                .unwrap_or("")
                .to_string(),
            _ => return Err(self.err_here("mismatched input", Some(what))),
        };
        self.advance();
        Ok(s)
    }

    fn bool_constant(&mut self) -> PResult<bool> {
        if self.eat_kw("true") {
            Ok(true)
        } else if self.eat_kw("false") {
            Ok(false)
        } else {
            Err(self.err_here("mismatched input", Some("true or false")))
        }
    }

    /// `[WITH option (AND option)*]` of CREATE / ALTER ROLE.
    fn role_options(&mut self) -> PResult<RoleOptions> {
        let mut o = RoleOptions::default();
        if !self.eat_kw("with") {
            return Ok(o);
        }
        loop {
            let at = self.tok();
            let duplicate = if self.eat_kw("password") {
                self.expect(TokenKind::Eq, "'='")?;
                o.password
                    .replace(self.string_constant("a string")?)
                    .is_some()
            } else if self.eat_kw("hashed") {
                self.expect_kw("password", "PASSWORD")?;
                self.expect(TokenKind::Eq, "'='")?;
                o.hashed_password
                    .replace(self.string_constant("a string")?)
                    .is_some()
            } else if self.eat_kw("login") {
                self.expect(TokenKind::Eq, "'='")?;
                o.login.replace(self.bool_constant()?).is_some()
            } else if self.eat_kw("superuser") {
                self.expect(TokenKind::Eq, "'='")?;
                o.superuser.replace(self.bool_constant()?).is_some()
            } else if self.eat_kw("options") {
                self.expect(TokenKind::Eq, "'='")?;
                if self.kind() != TokenKind::LBrace {
                    return Err(self.err_here("mismatched input", Some("a map")));
                }
                let OptionValue::Map(entries) = self.option_value()? else {
                    return Err(self.err_at(at, "OPTIONS must be a map", None));
                };
                o.options.replace(entries).is_some()
            } else {
                return Err(self.err_here(
                    "mismatched input",
                    Some("PASSWORD, HASHED PASSWORD, LOGIN, SUPERUSER or OPTIONS"),
                ));
            };
            if duplicate {
                return Err(self.err_at(at, "Multiple definition for a role option", None));
            }
            if !self.eat_kw("and") {
                return Ok(o);
            }
        }
    }

    /// `[WITH [HASHED] PASSWORD 'p'] [SUPERUSER | NOSUPERUSER]` of CREATE / ALTER USER.
    fn user_options(&mut self) -> PResult<RoleOptions> {
        let mut o = RoleOptions::default();
        if self.eat_kw("with") {
            let hashed = self.eat_kw("hashed");
            self.expect_kw("password", "PASSWORD")?;
            // Cassandra writes no `=` here; tolerate one.
            self.eat(TokenKind::Eq);
            let p = self.string_constant("a string")?;
            if hashed {
                o.hashed_password = Some(p);
            } else {
                o.password = Some(p);
            }
        }
        if self.eat_kw("superuser") {
            o.superuser = Some(true);
        } else if self.eat_kw("nosuperuser") {
            o.superuser = Some(false);
        }
        Ok(o)
    }

    /// A permission keyword at token `n` ahead, if there is one.
    fn permission_at(&self, n: usize) -> Option<Permission> {
        let t = self.tok_at(n);
        if t.kind != TokenKind::Ident {
            return None;
        }
        Permission::from_name(t.text(self.src))
    }

    /// `ALL [PERMISSIONS]` or `perm [PERMISSION] (, perm [PERMISSION])*`; returns the
    /// permissions and whether ALL was written.
    fn permissions(&mut self) -> PResult<(Vec<Permission>, bool)> {
        if self.eat_kw("all") {
            self.eat_kw("permissions");
            return Ok((Permission::ALL.to_vec(), true));
        }
        let mut out = Vec::new();
        loop {
            let Some(p) = self.permission_at(0) else {
                return Err(self.err_here("mismatched input", Some("a permission")));
            };
            self.advance();
            self.eat_kw("permission");
            if !out.contains(&p) {
                out.push(p);
            }
            if !self.eat(TokenKind::Comma) {
                return Ok((out, false));
            }
        }
    }

    /// `ALL KEYSPACES | KEYSPACE ks | [TABLE] [ks.]t | ALL ROLES | ROLE r`.
    fn resource(&mut self) -> PResult<Resource> {
        if self.is_kw("all") {
            if self.is_kw_at(1, "keyspaces") {
                self.advance();
                self.advance();
                return Ok(Resource::AllKeyspaces);
            }
            if self.is_kw_at(1, "roles") {
                self.advance();
                self.advance();
                return Ok(Resource::AllRoles);
            }
            self.advance();
            return Err(self.err_here("mismatched input", Some("KEYSPACES or ROLES")));
        }
        if self.eat_kw("keyspace") {
            return self.ident("a keyspace name").map(Resource::Keyspace);
        }
        if self.is_kw("role") && self.kind_at(1) != TokenKind::Dot {
            self.advance();
            return self.role_name().map(Resource::Role);
        }
        self.eat_kw("table");
        self.qualified_name().map(Resource::Table)
    }

    /// After GRANT / REVOKE: permissions on a resource, or a role to a role.
    fn grant_or_revoke(&mut self, grant: bool) -> PResult<Statement> {
        let (to, to_upper) = if grant {
            ("to", "TO")
        } else {
            ("from", "FROM")
        };
        let on_permissions = self.permission_at(0).is_some()
            || (self.is_kw("all") && (self.is_kw_at(1, "permissions") || self.is_kw_at(1, "on")));
        if on_permissions {
            let (permissions, all) = self.permissions()?;
            self.expect_kw("on", "ON")?;
            let resource = self.resource()?;
            self.expect_kw(to, to_upper)?;
            let role = self.role_name()?;
            let change = PermissionChange {
                permissions,
                all,
                resource,
                role,
            };
            return Ok(if grant {
                Statement::GrantPermissions(change)
            } else {
                Statement::RevokePermissions(change)
            });
        }
        let role = self.role_name()?;
        self.expect_kw(to, to_upper)?;
        let grantee = self.role_name()?;
        let m = RoleMembership { role, grantee };
        Ok(if grant {
            Statement::GrantRole(m)
        } else {
            Statement::RevokeRole(m)
        })
    }

    /// `[OF role] [NORECURSIVE]`.
    fn of_role(&mut self) -> PResult<(Option<String>, bool)> {
        let of = if self.eat_kw("of") {
            Some(self.role_name()?)
        } else {
            None
        };
        Ok((of, !self.eat_kw("norecursive")))
    }

    /// After LIST: ROLES, USERS or permissions.
    fn list(&mut self) -> PResult<Statement> {
        if self.eat_kw("roles") {
            let (of, recursive) = self.of_role()?;
            return Ok(Statement::ListRoles(ListRoles {
                of,
                recursive,
                users: false,
            }));
        }
        if self.eat_kw("users") {
            return Ok(Statement::ListRoles(ListRoles {
                of: None,
                recursive: true,
                users: true,
            }));
        }
        let (permissions, _) = self.permissions()?;
        let resource = if self.eat_kw("on") {
            Some(self.resource()?)
        } else {
            None
        };
        let (of, recursive) = self.of_role()?;
        Ok(Statement::ListPermissions(ListPermissions {
            permissions,
            resource,
            of,
            recursive,
        }))
    }

    fn with_internals(&mut self) -> PResult<bool> {
        if self.eat_kw("with") {
            self.expect_kw("internals", "INTERNALS")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn describe(&mut self) -> PResult<Describe> {
        // Keyword forms first; a bare name is last. `DESCRIBE keyspaces` is the listing,
        // as in cqlsh, even if a table has that name.
        let at_end =
            |p: &Self, n: usize| matches!(p.kind_at(n), TokenKind::Eof | TokenKind::Semicolon);
        if self.is_kw("cluster") && at_end(self, 1) {
            self.advance();
            return Ok(Describe::Cluster);
        }
        if self.is_kw("full") && self.is_kw_at(1, "schema") {
            self.advance();
            self.advance();
            return Ok(Describe::Schema { full: true });
        }
        if self.eat_kw("schema") {
            return Ok(Describe::Schema { full: false });
        }
        for (kw, d) in [
            ("keyspaces", Describe::Keyspaces),
            ("tables", Describe::Tables),
            ("types", Describe::Types),
            ("functions", Describe::Functions),
            ("aggregates", Describe::Aggregates),
        ] {
            if self.is_kw(kw) && at_end(self, 1) {
                self.advance();
                return Ok(d);
            }
        }
        let only = self.is_kw("only") && self.is_kw_at(1, "keyspace") && {
            self.advance();
            true
        };
        if self.eat_kw("keyspace") {
            let name = if self.at_ident() {
                Some(self.ident("a keyspace name")?)
            } else {
                None
            };
            let with_internals = self.with_internals()?;
            return Ok(Describe::Keyspace {
                name,
                only,
                with_internals,
            });
        }
        if self.eat_kw("table") || self.eat_kw("columnfamily") {
            let name = self.qualified_name()?;
            let with_internals = self.with_internals()?;
            return Ok(Describe::Table {
                name,
                with_internals,
            });
        }
        if self.at_ident() {
            let name = self.qualified_name()?;
            let with_internals = self.with_internals()?;
            return Ok(Describe::Name {
                name,
                with_internals,
            });
        }
        Err(self.no_viable())
    }
}

mod transaction;

#[cfg(test)]
mod tests;
