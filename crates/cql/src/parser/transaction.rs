//! `BEGIN TRANSACTION ... COMMIT TRANSACTION` in Cassandra's Accord syntax (`Parser.g`,
//! rule `batchTxnStatement`, with the 6.0 branch's `ELSE IF` / `ELSE` and writes after
//! `END IF`): LETs, an optional returning SELECT, an optional IF block and full-key writes.

use super::{PResult, Parser};
use crate::ast::*;
use crate::lexer::TokenKind;

impl Parser<'_> {
    /// `BEGIN TRANSACTION ... COMMIT TRANSACTION`.
    pub(super) fn transaction(&mut self) -> PResult<Transaction> {
        self.advance(); // BEGIN
        self.advance(); // TRANSACTION
        let mut txn = Transaction {
            lets: Vec::new(),
            returning: None,
            writes: Vec::new(),
            branches: Vec::new(),
        };
        while self.is_kw("let") {
            self.advance();
            let name = self.ident("a LET name")?;
            self.expect(TokenKind::Eq, "'='")?;
            self.expect(TokenKind::LParen, "'('")?;
            if !self.is_kw("select") {
                return Err(self.err_here("mismatched input", Some("SELECT")));
            }
            let select = self.select()?;
            self.expect(TokenKind::RParen, "')'")?;
            self.expect(TokenKind::Semicolon, "';'")?;
            txn.lets.push(LetStatement { name, select });
        }
        if self.is_kw("select") {
            txn.returning = Some(self.returning()?);
            self.expect(TokenKind::Semicolon, "';'")?;
        }
        if self.is_kw("if") {
            self.advance();
            loop {
                let conditions = self.txn_conditions()?;
                self.expect_kw("then", "THEN")?;
                let writes = self.txn_writes()?;
                txn.branches.push(TxnBranch { conditions, writes });
                if self.is_kw("else") && self.is_kw_at(1, "if") {
                    self.advance();
                    self.advance();
                    continue;
                }
                if self.eat_kw("else") {
                    let writes = self.txn_writes()?;
                    txn.branches.push(TxnBranch {
                        conditions: Vec::new(),
                        writes,
                    });
                }
                break;
            }
            self.expect_kw("end", "END IF")?;
            self.expect_kw("if", "IF")?;
            self.eat(TokenKind::Semicolon);
        }
        txn.writes = self.txn_writes()?;
        if self.is_kw("if") {
            return Err(self.err_here(
                "an IF block must come before the transaction's other writes",
                None,
            ));
        }
        self.expect_kw("commit", "COMMIT TRANSACTION")?;
        self.expect_kw("transaction", "TRANSACTION")?;
        Ok(txn)
    }

    /// The returning `SELECT`: `SELECT a.x, b.y` or a plain SELECT.
    fn returning(&mut self) -> PResult<TxnReturning> {
        let references_follow =
            matches!(self.kind_at(1), TokenKind::Ident | TokenKind::QuotedIdent)
                && self.kind_at(2) == TokenKind::Dot;
        if !references_follow {
            return self.select().map(|s| TxnReturning::Select(Box::new(s)));
        }
        self.advance(); // SELECT
        let mut refs = vec![self.column_reference()?];
        while self.eat(TokenKind::Comma) {
            refs.push(self.column_reference()?);
        }
        if self.is_kw("from") {
            return Err(self.err_here("a SELECT of LET references has no FROM clause", None));
        }
        Ok(TxnReturning::References(refs))
    }

    /// `name.column`.
    fn column_reference(&mut self) -> PResult<RowReference> {
        let row = self.ident("a LET name")?;
        self.expect(TokenKind::Dot, "'.'")?;
        let column = self.ident("a column name")?;
        if self.kind() == TokenKind::LBracket || self.kind() == TokenKind::Dot {
            return Err(self.err_here(
                "element and field references are not supported in transactions",
                None,
            ));
        }
        Ok(RowReference {
            row,
            column: Some(column),
        })
    }

    /// `name` or `name.column`, on the left of a condition.
    fn row_reference(&mut self) -> PResult<RowReference> {
        if self.kind_at(1) == TokenKind::Dot {
            return self.column_reference();
        }
        let row = self.ident("a LET name")?;
        Ok(RowReference { row, column: None })
    }

    /// `cond AND cond ...`.
    fn txn_conditions(&mut self) -> PResult<Vec<TxnCondition>> {
        let mut out = vec![self.txn_condition()?];
        loop {
            if self.eat_kw("and") {
                out.push(self.txn_condition()?);
            } else if self.is_kw("or") {
                return Err(self.err_here("OR is not supported in transaction conditions", None));
            } else {
                return Ok(out);
            }
        }
    }

    /// `ref IS [NOT] NULL`, `ref op term` or `term op ref`.
    fn txn_condition(&mut self) -> PResult<TxnCondition> {
        let reference_first =
            self.at_ident() && !self.is_term_keyword() && self.kind_at(1) != TokenKind::LParen;
        if reference_first {
            let reference = self.row_reference()?;
            if self.eat_kw("is") {
                let test = if self.eat_kw("not") {
                    TxnTest::IsNotNull
                } else {
                    TxnTest::IsNull
                };
                self.expect_kw("null", "NULL")?;
                return Ok(TxnCondition { reference, test });
            }
            let op = self.txn_operator()?;
            if reference.column.is_none() {
                return Err(self.err_here(
                    "a whole LET row can only be tested with IS NULL or IS NOT NULL",
                    None,
                ));
            }
            let term = self.term()?;
            if let Term::Reference(_) = term {
                return Err(self.err_here("comparing two LET references is not supported", None));
            }
            return Ok(TxnCondition {
                reference,
                test: TxnTest::Compare(op, term),
            });
        }
        let term = self.term()?;
        let op = self.txn_operator()?;
        let reference = self.column_reference()?;
        let reversed = match op {
            Operator::Lt => Operator::Gt,
            Operator::Le => Operator::Ge,
            Operator::Gt => Operator::Lt,
            Operator::Ge => Operator::Le,
            other => other,
        };
        Ok(TxnCondition {
            reference,
            test: TxnTest::Compare(reversed, term),
        })
    }

    /// `= < <= > >= !=`; IN, CONTAINS and LIKE are named as unsupported.
    fn txn_operator(&mut self) -> PResult<Operator> {
        for word in ["in", "contains", "like"] {
            if self.is_kw(word) {
                return Err(self.err_here(
                    "IN, CONTAINS and LIKE are not supported in transaction conditions",
                    None,
                ));
            }
        }
        self.comparison()
            .ok_or_else(|| self.err_here("mismatched input", Some("a comparison operator")))
    }

    /// INSERT / UPDATE / DELETE statements, each ended by `;`, up to something else.
    fn txn_writes(&mut self) -> PResult<Vec<BatchStatement>> {
        let mut out = Vec::new();
        loop {
            let st = if self.is_kw("insert") {
                BatchStatement::Insert(self.insert()?)
            } else if self.is_kw("update") {
                BatchStatement::Update(self.update()?)
            } else if self.is_kw("delete") {
                BatchStatement::Delete(self.delete()?)
            } else if self.is_kw("select") || self.is_kw("let") {
                return Err(self.err_here(
                    "LET and SELECT must come before the transaction's writes",
                    None,
                ));
            } else if self.is_kw("begin") || self.is_kw("apply") {
                return Err(self.err_here(
                    "only INSERT, UPDATE and DELETE are supported inside a transaction",
                    None,
                ));
            } else {
                return Ok(out);
            };
            self.expect(TokenKind::Semicolon, "';'")?;
            out.push(st);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ast::*;
    use crate::parser::parse;
    use proptest::prelude::*;

    fn txn(text: &str) -> Transaction {
        match parse(text) {
            Ok(p) => match p.statement {
                Statement::Transaction(t) => *t,
                other => panic!("not a transaction: {other:?}"),
            },
            Err(e) => panic!("{text}\n  -> {e}"),
        }
    }

    fn reference(row: &str, column: Option<&str>) -> RowReference {
        RowReference {
            row: row.into(),
            column: column.map(str::to_string),
        }
    }

    #[test]
    fn a_transfer_with_lets_returning_refs_and_an_if_parses() {
        let text = "BEGIN TRANSACTION
              LET src = (SELECT balance FROM ks.acct WHERE id = ?);
              LET dst = (SELECT balance FROM ks.acct WHERE id = ? LIMIT 1);
              SELECT src.balance, dst.balance;
              IF src.balance >= ? AND dst IS NOT NULL THEN
                UPDATE ks.acct SET balance = balance - ? WHERE id = ?;
                UPDATE ks.acct SET balance = src.balance WHERE id = ?;
              END IF
            COMMIT TRANSACTION";
        let p = parse(text).unwrap();
        assert_eq!(p.bind_count, 6);
        let t = txn(text);
        assert_eq!(t.lets.len(), 2);
        assert_eq!(t.lets[0].name, "src");
        assert!(t.lets[1].select.limit.is_some());
        assert_eq!(
            t.returning,
            Some(TxnReturning::References(vec![
                reference("src", Some("balance")),
                reference("dst", Some("balance")),
            ]))
        );
        assert_eq!(t.branches.len(), 1);
        let conds = &t.branches[0].conditions;
        assert_eq!(conds[0].reference, reference("src", Some("balance")));
        assert!(matches!(
            conds[0].test,
            TxnTest::Compare(Operator::Ge, Term::Bind(_))
        ));
        assert_eq!(conds[1].reference, reference("dst", None));
        assert_eq!(conds[1].test, TxnTest::IsNotNull);
        let [BatchStatement::Update(debit), BatchStatement::Update(credit)] =
            &t.branches[0].writes[..]
        else {
            panic!("two updates expected: {:?}", t.branches[0].writes);
        };
        assert!(matches!(debit.assignments[0], Assignment::Subtract { .. }));
        assert_eq!(
            credit.assignments[0],
            Assignment::Set {
                column: "balance".into(),
                value: Term::Reference(reference("src", Some("balance"))),
            }
        );
        assert!(t.writes.is_empty());
    }

    #[test]
    fn else_if_else_and_writes_after_end_if_parse() {
        let t = txn("BEGIN TRANSACTION LET a = (SELECT v FROM t WHERE k = 1);
            IF a IS NULL THEN INSERT INTO t (k, v) VALUES (1, 0);
            ELSE IF 5 < a.v THEN UPDATE t SET v = 0 WHERE k = 1;
            ELSE DELETE FROM t WHERE k = 1;
            END IF
            INSERT INTO log (k) VALUES (2);
            COMMIT TRANSACTION");
        assert_eq!(t.branches.len(), 3);
        assert_eq!(t.branches[0].conditions[0].test, TxnTest::IsNull);
        // `5 < a.v` is stored as `a.v > 5`.
        assert!(matches!(
            t.branches[1].conditions[0].test,
            TxnTest::Compare(Operator::Gt, Term::Literal(Literal::Integer(_)))
        ));
        assert!(t.branches[2].conditions.is_empty());
        assert_eq!(t.writes.len(), 1);
    }

    #[test]
    fn writes_only_and_a_plain_returning_select_parse() {
        let t = txn("begin transaction select * from t where k = 1; \
                     insert into t (k, v) values (1, 2); commit transaction;");
        assert!(matches!(t.returning, Some(TxnReturning::Select(_))));
        assert!(t.branches.is_empty());
        assert_eq!(t.writes.len(), 1);
    }

    #[test]
    fn unsupported_forms_are_named() {
        let cases = [
            (
                "BEGIN TRANSACTION LET a = (SELECT v FROM t WHERE k = 1); IF a.v = 1 OR a.v = 2 THEN DELETE FROM t WHERE k = 1; END IF COMMIT TRANSACTION",
                "OR is not supported",
            ),
            (
                "BEGIN TRANSACTION LET a = (SELECT v FROM t WHERE k = 1); IF a.v IN (1, 2) THEN DELETE FROM t WHERE k = 1; END IF COMMIT TRANSACTION",
                "IN, CONTAINS and LIKE are not supported",
            ),
            (
                "BEGIN TRANSACTION LET a = (SELECT v FROM t WHERE k = 1); LET b = (SELECT v FROM t WHERE k = 2); IF a.v = b.v THEN DELETE FROM t WHERE k = 1; END IF COMMIT TRANSACTION",
                "comparing two LET references",
            ),
            (
                "BEGIN TRANSACTION INSERT INTO t (k) VALUES (1); SELECT * FROM t WHERE k = 1; COMMIT TRANSACTION",
                "must come before",
            ),
            (
                "BEGIN TRANSACTION LET a = (SELECT v FROM t WHERE k = 1); IF a = 1 THEN DELETE FROM t WHERE k = 1; END IF COMMIT TRANSACTION",
                "IS NULL or IS NOT NULL",
            ),
            (
                "BEGIN TRANSACTION INSERT INTO t (k) VALUES (1); IF a IS NULL THEN DELETE FROM t WHERE k = 1; END IF COMMIT TRANSACTION",
                "IF block must come before",
            ),
        ];
        for (text, named) in cases {
            let e = parse(text).expect_err(text);
            assert!(e.message.contains(named), "{text}: {e}");
        }
        // Accord refuses arithmetic on a LET reference.
        let e = parse("BEGIN TRANSACTION LET a = (SELECT v FROM t WHERE k = 1); UPDATE t SET v = a.v - 1 WHERE k = 2; COMMIT TRANSACTION").unwrap_err();
        assert_eq!(e.found, "-");
        // A missing COMMIT TRANSACTION.
        assert!(parse("BEGIN TRANSACTION INSERT INTO t (k) VALUES (1);").is_err());
        // A batch still parses as a batch.
        assert!(matches!(
            parse("BEGIN BATCH INSERT INTO t (k) VALUES (1); APPLY BATCH")
                .unwrap()
                .statement,
            Statement::Batch(_)
        ));
    }

    proptest! {
        #[test]
        fn transaction_shaped_text_never_panics(
            words in proptest::collection::vec(
                proptest::sample::select(vec![
                    "BEGIN", "TRANSACTION", "COMMIT", "LET", "a", "=", "(", ")", "SELECT", "v",
                    "FROM", "t", "WHERE", "k", "1", "?", ";", "IF", "THEN", "ELSE", "END", "AND",
                    "OR", "IS", "NOT", "NULL", "a.v", ".", ">=", "UPDATE", "SET", "-", "INSERT",
                    "INTO", "VALUES", "DELETE", "LIMIT",
                ]),
                0..40,
            )
        ) {
            let text = format!("BEGIN TRANSACTION {}", words.join(" "));
            let _ = parse(&text);
        }
    }
}
