//! The Sluice node: shards, connections, the request path and the query engine.
