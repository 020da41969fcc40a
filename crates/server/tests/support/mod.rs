//! Test support shared by the integration tests and the request-path example.

pub mod request_path;
