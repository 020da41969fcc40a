//! The statement AST the parser produces and the query engine consumes.
//!
//! Names are already case-folded: unquoted identifiers are lower case, quoted ones keep
//! their case. The AST owns its strings because parsed statements live in the statement
//! cache and are reused across requests; the hot path never re-parses.

use sluice_types::CqlType;

/// A possibly keyspace-qualified table (or other object) name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    /// The keyspace, when written (`ks.t`); otherwise the connection's current keyspace applies.
    pub keyspace: Option<String>,
    /// The object name.
    pub name: String,
}

/// A bind marker: `?` or `:name`. `index` is its position among all markers of the
/// statement, counted from 0 in the order they appear in the text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BindMarker {
    /// Position among the statement's markers.
    pub index: usize,
    /// The name for `:name` markers.
    pub name: Option<String>,
}

/// A literal constant, kept as written so that it can be typed against its receiver.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// `NULL`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer literal as written, including a leading `-` (typed later: int, bigint, varint...).
    Integer(String),
    /// A float literal as written (`1.5`, `-2e10`, `NaN`, `Infinity`).
    Float(String),
    /// A single-quoted or `$$` string, unescaped.
    String(String),
    /// `0x...` blob literal, decoded.
    Blob(Vec<u8>),
    /// A UUID literal (`123e4567-e89b-12d3-a456-426614174000`).
    Uuid([u8; 16]),
    /// A duration literal (`1h30m`, `P1DT2H`, `10ms`), as written.
    Duration(String),
}

/// A value expression: anything that stands where a value goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Term {
    /// A constant.
    Literal(Literal),
    /// A bind marker.
    Bind(BindMarker),
    /// `[a, b]`.
    List(Vec<Term>),
    /// `{a, b}` (also the empty `{}`, which may be a set or a map: typed by its receiver).
    Set(Vec<Term>),
    /// `{k: v, ...}`.
    Map(Vec<(Term, Term)>),
    /// `(a, b)` or a UDT literal is not supported; tuples are.
    Tuple(Vec<Term>),
    /// A function call such as `now()`, `uuid()`, `toTimestamp(now())`, `token(?)`.
    Function {
        /// Lower-cased function name.
        name: String,
        /// Arguments.
        args: Vec<Term>,
    },
    /// `(type) term`: a type hint/cast.
    Cast(CqlType, Box<Term>),
    /// `name.column`: a column of a transaction's LET row (only inside `BEGIN TRANSACTION`).
    Reference(RowReference),
}

/// A reference to a transaction's LET row (`name`) or one of its columns (`name.column`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowReference {
    /// The LET name.
    pub row: String,
    /// The column, when one is named.
    pub column: Option<String>,
}

/// The comparison in a WHERE relation or IF condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `=`
    Eq,
    /// `!=`
    Neq,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `IN`
    In,
    /// `CONTAINS`
    Contains,
    /// `CONTAINS KEY`
    ContainsKey,
    /// `LIKE`
    Like,
}

/// The left-hand side of a WHERE relation.
#[derive(Debug, Clone, PartialEq)]
pub enum RelationLhs {
    /// `col`
    Column(String),
    /// `token(a, b)`
    Token(Vec<String>),
    /// `(c1, c2)`: multi-column clustering relation.
    Tuple(Vec<String>),
    /// `col[key]` (map element in a filter).
    Element(String, Term),
}

/// The right-hand side of a relation.
#[derive(Debug, Clone, PartialEq)]
pub enum RelationRhs {
    /// A single value (`= ?`, `> 5`, `= (1, 2)` for tuples).
    Term(Term),
    /// `IN (a, b, ...)`.
    InList(Vec<Term>),
    /// `IN ?` (one marker bound to a list).
    InMarker(BindMarker),
}

/// One `lhs op rhs` of a WHERE clause (all relations are ANDed).
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    /// What is compared.
    pub lhs: RelationLhs,
    /// How.
    pub op: Operator,
    /// Against what.
    pub rhs: RelationRhs,
}

/// `USING TTL / TIMESTAMP / TIMEOUT` parameters of a DML statement.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Using {
    /// `USING TTL n` (seconds).
    pub ttl: Option<Term>,
    /// `USING TIMESTAMP n` (microseconds).
    pub timestamp: Option<Term>,
    /// `USING TIMEOUT d` (ScyllaDB extension): the request's deadline.
    pub timeout: Option<Term>,
}

/// One item of a SELECT clause.
#[derive(Debug, Clone, PartialEq)]
pub enum Selector {
    /// A column, optionally aliased.
    Column {
        /// Column name.
        name: String,
        /// `AS alias`.
        alias: Option<String>,
    },
    /// A function over selectors: `token(pk)`, `writetime(c)`, `ttl(c)`, `count(*)`,
    /// `count(c)`, `max(c)`, `toJson(c)`...; `count(*)` has an empty `args` and `star = true`.
    Function {
        /// Lower-cased name.
        name: String,
        /// Arguments.
        args: Vec<Selector>,
        /// True for `f(*)`, i.e. `count(*)`.
        star: bool,
        /// `AS alias`.
        alias: Option<String>,
    },
    /// A constant or bind marker in the selection (rare; `SELECT 1 FROM ...` is not CQL, but casts are).
    Term(Term),
}

/// `SELECT`.
#[derive(Debug, Clone, PartialEq)]
pub struct Select {
    /// `SELECT JSON`.
    pub json: bool,
    /// `SELECT DISTINCT`.
    pub distinct: bool,
    /// The selection; empty means `*`.
    pub selectors: Vec<Selector>,
    /// The table.
    pub table: QualifiedName,
    /// The WHERE relations (ANDed).
    pub where_clause: Vec<Relation>,
    /// `GROUP BY` columns.
    pub group_by: Vec<String>,
    /// `ORDER BY col ASC|DESC`: (column, ascending).
    pub order_by: Vec<(String, bool)>,
    /// `PER PARTITION LIMIT`.
    pub per_partition_limit: Option<Term>,
    /// `LIMIT`.
    pub limit: Option<Term>,
    /// `ALLOW FILTERING`.
    pub allow_filtering: bool,
    /// `BYPASS CACHE` (ScyllaDB extension; accepted, no effect).
    pub bypass_cache: bool,
    /// `USING TIMEOUT` (ScyllaDB extension).
    pub timeout: Option<Term>,
}

/// A condition of a conditional (LWT) statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// `IF NOT EXISTS` (INSERT).
    NotExists,
    /// `IF EXISTS` (UPDATE / DELETE).
    Exists,
    /// `IF col op value [AND ...]`.
    Columns(Vec<Relation>),
}

/// `INSERT`.
#[derive(Debug, Clone, PartialEq)]
pub struct Insert {
    /// The table.
    pub table: QualifiedName,
    /// Column names, in order.
    pub columns: Vec<String>,
    /// Values, one per column. For `INSERT ... JSON`, a single term holding the JSON text.
    pub values: Vec<Term>,
    /// `INSERT INTO t JSON '...'`.
    pub json: bool,
    /// `IF NOT EXISTS`.
    pub if_not_exists: bool,
    /// USING clause.
    pub using: Using,
}

/// What an UPDATE assignment does to its column.
#[derive(Debug, Clone, PartialEq)]
pub enum Assignment {
    /// `col = term`.
    Set {
        /// Column.
        column: String,
        /// New value.
        value: Term,
    },
    /// `col[key] = term` (list index or map key).
    SetElement {
        /// Column.
        column: String,
        /// List index or map key.
        key: Term,
        /// New element value.
        value: Term,
    },
    /// `col = col + term` (counter increment, list append, set/map add).
    Add {
        /// Column.
        column: String,
        /// Operand.
        value: Term,
    },
    /// `col = col - term` (counter decrement, list/set/map removal).
    Subtract {
        /// Column.
        column: String,
        /// Operand.
        value: Term,
    },
    /// `col = term + col` (list prepend).
    Prepend {
        /// Column.
        column: String,
        /// Operand.
        value: Term,
    },
}

/// `UPDATE`.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// The table.
    pub table: QualifiedName,
    /// USING clause (it comes before SET in CQL).
    pub using: Using,
    /// SET assignments.
    pub assignments: Vec<Assignment>,
    /// WHERE relations.
    pub where_clause: Vec<Relation>,
    /// IF condition.
    pub condition: Option<Condition>,
}

/// One target of a DELETE: a whole column or one element of a collection.
#[derive(Debug, Clone, PartialEq)]
pub struct DeleteTarget {
    /// Column.
    pub column: String,
    /// `col[key]`: list index or map key.
    pub element: Option<Term>,
}

/// `DELETE`.
#[derive(Debug, Clone, PartialEq)]
pub struct Delete {
    /// Columns to delete; empty means the whole row (or range / partition).
    pub targets: Vec<DeleteTarget>,
    /// The table.
    pub table: QualifiedName,
    /// USING clause (TIMESTAMP, TIMEOUT).
    pub using: Using,
    /// WHERE relations.
    pub where_clause: Vec<Relation>,
    /// IF condition.
    pub condition: Option<Condition>,
}

/// The kind of a BATCH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    /// `BEGIN BATCH` (logged).
    Logged,
    /// `BEGIN UNLOGGED BATCH`.
    Unlogged,
    /// `BEGIN COUNTER BATCH`.
    Counter,
}

/// A DML statement allowed inside a BATCH.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchStatement {
    /// INSERT.
    Insert(Insert),
    /// UPDATE.
    Update(Update),
    /// DELETE.
    Delete(Delete),
}

/// `BEGIN [UNLOGGED|COUNTER] BATCH ... APPLY BATCH`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Logged, unlogged or counter.
    pub kind: BatchKind,
    /// USING clause of the batch itself.
    pub using: Using,
    /// The statements, in order.
    pub statements: Vec<BatchStatement>,
}

/// `LET name = (SELECT ...)` of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct LetStatement {
    /// The name the row is referred to by.
    pub name: String,
    /// The single-row SELECT.
    pub select: Select,
}

/// What a transaction returns.
#[derive(Debug, Clone, PartialEq)]
pub enum TxnReturning {
    /// A plain single-partition SELECT.
    Select(Box<Select>),
    /// `SELECT a.x, b.y`: columns of LET rows, as one row.
    References(Vec<RowReference>),
}

/// The test a transaction condition applies to a LET reference.
#[derive(Debug, Clone, PartialEq)]
pub enum TxnTest {
    /// `IS NULL` (a row reference: the row does not exist).
    IsNull,
    /// `IS NOT NULL`.
    IsNotNull,
    /// `op term`.
    Compare(Operator, Term),
}

/// One AND-ed condition of a transaction's IF.
#[derive(Debug, Clone, PartialEq)]
pub struct TxnCondition {
    /// The LET reference tested.
    pub reference: RowReference,
    /// The test (a `term op ref` is stored with the operator reversed).
    pub test: TxnTest,
}

/// `IF cond AND ... THEN writes` (or a final `ELSE writes`, with no conditions).
#[derive(Debug, Clone, PartialEq)]
pub struct TxnBranch {
    /// The AND-ed conditions; empty for `ELSE`.
    pub conditions: Vec<TxnCondition>,
    /// The writes of the branch.
    pub writes: Vec<BatchStatement>,
}

/// `BEGIN TRANSACTION ... COMMIT TRANSACTION`.
#[derive(Debug, Clone, PartialEq)]
pub struct Transaction {
    /// The LET statements, in order.
    pub lets: Vec<LetStatement>,
    /// The returning SELECT.
    pub returning: Option<TxnReturning>,
    /// Writes outside any IF (before the IF when there is none, else after `END IF`).
    pub writes: Vec<BatchStatement>,
    /// `IF ... THEN`, then each `ELSE IF ... THEN`, then `ELSE`; the first that holds runs.
    pub branches: Vec<TxnBranch>,
}

/// A constant in an option map (`WITH replication = {...}`, `WITH comment = '...'`).
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// A string.
    String(String),
    /// A number as written (integer or float, possibly negative).
    Number(String),
    /// `true` / `false`.
    Bool(bool),
    /// `{ 'k': v, ... }` (keys are string constants; values are option values).
    Map(Vec<(String, OptionValue)>),
    /// An identifier (e.g. `WITH caching = KEYS_ONLY` in old syntax).
    Identifier(String),
}

/// One `name = value` property of a `WITH` clause.
#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    /// Lower-cased property name.
    pub name: String,
    /// Its value.
    pub value: OptionValue,
}

/// `CREATE KEYSPACE`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateKeyspace {
    /// Keyspace name.
    pub name: String,
    /// `IF NOT EXISTS`.
    pub if_not_exists: bool,
    /// `WITH` properties (`replication`, `durable_writes`).
    pub properties: Vec<Property>,
}

/// `ALTER KEYSPACE`.
#[derive(Debug, Clone, PartialEq)]
pub struct AlterKeyspace {
    /// Keyspace name.
    pub name: String,
    /// `IF EXISTS`.
    pub if_exists: bool,
    /// New properties.
    pub properties: Vec<Property>,
}

/// One column declaration of CREATE TABLE.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDefinition {
    /// Column name.
    pub name: String,
    /// Column type.
    pub ty: CqlType,
    /// `STATIC`.
    pub is_static: bool,
    /// Declared inline as `name type PRIMARY KEY`.
    pub primary_key: bool,
}

/// `CREATE TABLE`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateTable {
    /// Table name.
    pub name: QualifiedName,
    /// `IF NOT EXISTS`.
    pub if_not_exists: bool,
    /// Columns, in declaration order.
    pub columns: Vec<ColumnDefinition>,
    /// Partition key columns (from `PRIMARY KEY ((a, b), c)` or the inline key).
    pub partition_key: Vec<String>,
    /// Clustering columns, in order.
    pub clustering_key: Vec<String>,
    /// `WITH CLUSTERING ORDER BY (c ASC|DESC, ...)`: (column, ascending).
    pub clustering_order: Vec<(String, bool)>,
    /// `WITH COMPACT STORAGE`.
    pub compact_storage: bool,
    /// Other `WITH` properties.
    pub properties: Vec<Property>,
}

/// What ALTER TABLE changes.
#[derive(Debug, Clone, PartialEq)]
pub enum AlterTableAction {
    /// `ADD col type [STATIC], ...`.
    Add(Vec<ColumnDefinition>),
    /// `DROP col, ...`.
    Drop(Vec<String>),
    /// `RENAME a TO b AND ...` (clustering/partition key columns only, as in Cassandra).
    Rename(Vec<(String, String)>),
    /// `ALTER col TYPE t`.
    AlterType(String, CqlType),
    /// `WITH prop = value AND ...`.
    With(Vec<Property>),
}

/// `ALTER TABLE`.
#[derive(Debug, Clone, PartialEq)]
pub struct AlterTable {
    /// Table name.
    pub name: QualifiedName,
    /// `IF EXISTS`.
    pub if_exists: bool,
    /// The change.
    pub action: AlterTableAction,
}

/// `DROP KEYSPACE` / `DROP TABLE`.
#[derive(Debug, Clone, PartialEq)]
pub struct Drop {
    /// Object name (for a keyspace, `keyspace` is None and `name` is the keyspace).
    pub name: QualifiedName,
    /// `IF EXISTS`.
    pub if_exists: bool,
}

/// `DESCRIBE ...` (server-side, as Cassandra 4+ does).
#[derive(Debug, Clone, PartialEq)]
pub enum Describe {
    /// `DESCRIBE CLUSTER`.
    Cluster,
    /// `DESCRIBE [FULL] SCHEMA`.
    Schema {
        /// `FULL` includes system keyspaces.
        full: bool,
    },
    /// `DESCRIBE KEYSPACES`.
    Keyspaces,
    /// `DESCRIBE [ONLY] KEYSPACE [ks] [WITH INTERNALS]`.
    Keyspace {
        /// The keyspace; None = current.
        name: Option<String>,
        /// `ONLY`: only the keyspace, not its tables.
        only: bool,
        /// `WITH INTERNALS`.
        with_internals: bool,
    },
    /// `DESCRIBE TABLES`.
    Tables,
    /// `DESCRIBE TABLE ks.t [WITH INTERNALS]`.
    Table {
        /// The table.
        name: QualifiedName,
        /// `WITH INTERNALS`.
        with_internals: bool,
    },
    /// `DESCRIBE TYPES`.
    Types,
    /// `DESCRIBE FUNCTIONS`.
    Functions,
    /// `DESCRIBE AGGREGATES`.
    Aggregates,
    /// `DESCRIBE name`: a keyspace or a table, resolved by the engine.
    Name {
        /// The name.
        name: QualifiedName,
        /// `WITH INTERNALS`.
        with_internals: bool,
    },
}

/// Any CQL statement Sluice understands.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// SELECT.
    Select(Select),
    /// INSERT.
    Insert(Insert),
    /// UPDATE.
    Update(Update),
    /// DELETE.
    Delete(Delete),
    /// BATCH.
    Batch(Batch),
    /// `BEGIN TRANSACTION ... COMMIT TRANSACTION` (Cassandra Accord syntax).
    Transaction(Box<Transaction>),
    /// USE ks.
    Use(String),
    /// CREATE KEYSPACE.
    CreateKeyspace(CreateKeyspace),
    /// ALTER KEYSPACE.
    AlterKeyspace(AlterKeyspace),
    /// DROP KEYSPACE.
    DropKeyspace(Drop),
    /// CREATE TABLE.
    CreateTable(CreateTable),
    /// ALTER TABLE.
    AlterTable(AlterTable),
    /// DROP TABLE.
    DropTable(Drop),
    /// TRUNCATE [TABLE] t.
    Truncate(QualifiedName),
    /// DESCRIBE / DESC.
    Describe(Describe),
    /// CREATE ROLE / CREATE USER.
    CreateRole(CreateRole),
    /// ALTER ROLE / ALTER USER.
    AlterRole(AlterRole),
    /// DROP ROLE / DROP USER.
    DropRole(DropRole),
    /// LIST ROLES / LIST USERS.
    ListRoles(ListRoles),
    /// GRANT permissions ON resource TO role.
    GrantPermissions(PermissionChange),
    /// REVOKE permissions ON resource FROM role.
    RevokePermissions(PermissionChange),
    /// LIST permissions [ON resource] [OF role] [NORECURSIVE].
    ListPermissions(ListPermissions),
    /// GRANT role TO grantee.
    GrantRole(RoleMembership),
    /// REVOKE role FROM revokee.
    RevokeRole(RoleMembership),
}

/// A permission as CQL names it (Cassandra's `Permission` enum, the data and role ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    /// CREATE.
    Create,
    /// ALTER.
    Alter,
    /// DROP.
    Drop,
    /// SELECT.
    Select,
    /// MODIFY (INSERT, UPDATE, DELETE, TRUNCATE).
    Modify,
    /// AUTHORIZE (GRANT and REVOKE).
    Authorize,
    /// DESCRIBE (LIST ROLES of all roles).
    Describe,
}

impl Permission {
    /// Every permission, in Cassandra's order.
    pub const ALL: [Permission; 7] = [
        Permission::Create,
        Permission::Alter,
        Permission::Drop,
        Permission::Select,
        Permission::Modify,
        Permission::Authorize,
        Permission::Describe,
    ];

    /// The upper-case name Cassandra stores and prints.
    pub const fn as_str(self) -> &'static str {
        match self {
            Permission::Create => "CREATE",
            Permission::Alter => "ALTER",
            Permission::Drop => "DROP",
            Permission::Select => "SELECT",
            Permission::Modify => "MODIFY",
            Permission::Authorize => "AUTHORIZE",
            Permission::Describe => "DESCRIBE",
        }
    }

    /// The permission named `name` (any case).
    pub fn from_name(name: &str) -> Option<Permission> {
        Permission::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(name))
    }
}

/// What a permission applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    /// `ALL KEYSPACES`.
    AllKeyspaces,
    /// `KEYSPACE ks`.
    Keyspace(String),
    /// `[TABLE] [ks.]t`.
    Table(QualifiedName),
    /// `ALL ROLES`.
    AllRoles,
    /// `ROLE r`.
    Role(String),
}

/// The options of CREATE / ALTER ROLE (`WITH ... AND ...`) or of CREATE / ALTER USER.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RoleOptions {
    /// `PASSWORD = '...'`.
    pub password: Option<String>,
    /// `HASHED PASSWORD = '...'`: an already salted bcrypt hash.
    pub hashed_password: Option<String>,
    /// `LOGIN = bool`.
    pub login: Option<bool>,
    /// `SUPERUSER = bool`.
    pub superuser: Option<bool>,
    /// `OPTIONS = { ... }` (kept; Cassandra's built-in role manager refuses them too).
    pub options: Option<Vec<(String, OptionValue)>>,
}

/// CREATE ROLE / CREATE USER.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRole {
    /// The role name (unquoted names are lower-cased; strings keep their case).
    pub name: String,
    /// `IF NOT EXISTS`.
    pub if_not_exists: bool,
    /// The options.
    pub options: RoleOptions,
    /// Written as CREATE USER (which implies LOGIN).
    pub user_syntax: bool,
}

/// ALTER ROLE / ALTER USER.
#[derive(Debug, Clone, PartialEq)]
pub struct AlterRole {
    /// The role name.
    pub name: String,
    /// `IF EXISTS`.
    pub if_exists: bool,
    /// The options to change.
    pub options: RoleOptions,
}

/// DROP ROLE / DROP USER.
#[derive(Debug, Clone, PartialEq)]
pub struct DropRole {
    /// The role name.
    pub name: String,
    /// `IF EXISTS`.
    pub if_exists: bool,
}

/// LIST ROLES [OF role] [NORECURSIVE] / LIST USERS.
#[derive(Debug, Clone, PartialEq)]
pub struct ListRoles {
    /// `OF role`: only the roles granted to it.
    pub of: Option<String>,
    /// False with `NORECURSIVE`: only directly granted roles.
    pub recursive: bool,
    /// Written as LIST USERS (other columns; only roles that can log in).
    pub users: bool,
}

/// GRANT / REVOKE permissions.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionChange {
    /// The permissions (`ALL PERMISSIONS` lists them all).
    pub permissions: Vec<Permission>,
    /// Written as `ALL [PERMISSIONS]`.
    pub all: bool,
    /// The resource.
    pub resource: Resource,
    /// The grantee or revokee.
    pub role: String,
}

/// LIST permissions.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPermissions {
    /// The permissions asked about (`ALL` lists them all).
    pub permissions: Vec<Permission>,
    /// `ON resource` (None: every resource).
    pub resource: Option<Resource>,
    /// `OF role` (None: every role).
    pub of: Option<String>,
    /// False with `NORECURSIVE`: no inherited permissions and no parent resources.
    pub recursive: bool,
}

/// GRANT role TO grantee / REVOKE role FROM revokee.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleMembership {
    /// The role granted or revoked.
    pub role: String,
    /// The role that gains or loses it.
    pub grantee: String,
}

/// A parsed statement with the number of bind markers it has.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedStatement {
    /// The statement.
    pub statement: Statement,
    /// How many bind markers the text has (the length of the values list it takes).
    pub bind_count: usize,
}
