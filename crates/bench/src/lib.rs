//! Open-loop goodput benchmark for any CQL endpoint.
