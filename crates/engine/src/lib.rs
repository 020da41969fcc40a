//! The query engine: schema catalog, system tables, statement analysis and execution.
