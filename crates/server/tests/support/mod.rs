//! Test support shared by the integration tests and the request-path example.

pub mod node;
pub mod request_path;
