//! The SUPPORTED answer to OPTIONS: CQL and protocol versions, compression, and ScyllaDB's
//! sharding keys (spec §2.2) so that shard-aware drivers open one connection per shard and
//! route each statement to the shard that owns its token.
//!
//! The sharding keys are sent all together or not at all: the Rust driver ignores a partial
//! set and the Python scylla-driver crashes on one. `SCYLLA_SHARD_AWARE_PORT` is advertised
//! only when the listener really pins connections to `source_port % shards`.

use crate::IGNORE_MSB;

/// ScyllaDB's code for the per-partition rate-limit error (0xF000), advertised to clients.
pub const RATE_LIMIT_ERROR_CODE: u32 = 0xF000;

/// The SUPPORTED string multimap for a connection served by `shard`.
pub fn supported_options(
    shard: usize,
    nr_shards: usize,
    shard_aware_port: Option<u16>,
    host_id: &str,
) -> Vec<(String, Vec<String>)> {
    let one = |k: &str, v: String| (k.to_string(), vec![v]);
    let mut options = vec![
        one("CQL_VERSION", "3.4.7".into()),
        (
            "COMPRESSION".to_string(),
            vec!["lz4".to_string(), "snappy".to_string()],
        ),
        one("PROTOCOL_VERSIONS", "4/v4".into()),
        one("SCYLLA_SHARD", shard.to_string()),
        one("SCYLLA_NR_SHARDS", nr_shards.to_string()),
        one(
            "SCYLLA_PARTITIONER",
            "org.apache.cassandra.dht.Murmur3Partitioner".into(),
        ),
        one(
            "SCYLLA_SHARDING_ALGORITHM",
            "biased-token-round-robin".into(),
        ),
        one("SCYLLA_SHARDING_IGNORE_MSB", IGNORE_MSB.to_string()),
        one(
            "SCYLLA_RATE_LIMIT_ERROR",
            format!("ERROR_CODE={RATE_LIMIT_ERROR_CODE}"),
        ),
        one("SCYLLA_HOST_ID", host_id.to_string()),
    ];
    if let Some(port) = shard_aware_port {
        options.push(one("SCYLLA_SHARD_AWARE_PORT", port.to_string()));
    }
    options
}

/// STARTUP options this server reacts to, recorded per connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartupOptIns {
    /// The client echoed `SCYLLA_RATE_LIMIT_ERROR`: it may receive code 0xF000; others get
    /// Config_error (0x2300) instead, which no default retry policy retries.
    pub rate_limit_error: bool,
    /// The client echoed `SCYLLA_LWT_ADD_METADATA_MARK` (not advertised yet; recorded anyway).
    pub lwt_metadata_mark: bool,
}

impl StartupOptIns {
    /// Reads the opt-ins from a STARTUP string map.
    pub fn from_startup(options: &[(String, String)]) -> StartupOptIns {
        let has = |key: &str| options.iter().any(|(k, _)| k.eq_ignore_ascii_case(key));
        StartupOptIns {
            rate_limit_error: has("SCYLLA_RATE_LIMIT_ERROR"),
            lwt_metadata_mark: has("SCYLLA_LWT_ADD_METADATA_MARK"),
        }
    }
}

/// Checks STARTUP's `CQL_VERSION`: required, and (Cassandra's rule) a version >= 3.0.0.
/// Python sends the server's version, Rust "4.0.0", gocql and Java "3.0.0".
pub fn cql_version_acceptable(options: &[(String, String)]) -> bool {
    let Some((_, v)) = options
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("CQL_VERSION"))
    else {
        return false;
    };
    let major = v
        .split('.')
        .next()
        .and_then(|m| m.trim().parse::<u32>().ok());
    matches!(major, Some(m) if m >= 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(o: &'a [(String, Vec<String>)], k: &str) -> Option<&'a Vec<String>> {
        o.iter().find(|(key, _)| key == k).map(|(_, v)| v)
    }

    #[test]
    fn advertises_the_full_sharding_set() {
        let o = supported_options(3, 4, Some(19042), "8d1c7a4e-0000-4000-8000-000000000001");
        assert_eq!(get(&o, "SCYLLA_SHARD").unwrap(), &vec!["3".to_string()]);
        assert_eq!(get(&o, "SCYLLA_NR_SHARDS").unwrap(), &vec!["4".to_string()]);
        assert_eq!(
            get(&o, "SCYLLA_SHARDING_IGNORE_MSB").unwrap(),
            &vec!["12".to_string()]
        );
        assert_eq!(
            get(&o, "SCYLLA_SHARDING_ALGORITHM").unwrap(),
            &vec!["biased-token-round-robin".to_string()]
        );
        assert_eq!(
            get(&o, "SCYLLA_RATE_LIMIT_ERROR").unwrap(),
            &vec!["ERROR_CODE=61440".to_string()]
        );
        assert_eq!(
            get(&o, "SCYLLA_SHARD_AWARE_PORT").unwrap(),
            &vec!["19042".to_string()]
        );
        assert_eq!(
            get(&o, "COMPRESSION").unwrap(),
            &vec!["lz4".to_string(), "snappy".to_string()]
        );
        assert_eq!(get(&o, "CQL_VERSION").unwrap(), &vec!["3.4.7".to_string()]);
        assert!(get(&o, "SCYLLA_PARTITIONER").unwrap()[0].ends_with("Murmur3Partitioner"));
        let without = supported_options(0, 1, None, "x");
        assert!(get(&without, "SCYLLA_SHARD_AWARE_PORT").is_none());
    }

    #[test]
    fn startup_rules() {
        let opts = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(cql_version_acceptable(&opts(&[("CQL_VERSION", "4.0.0")])));
        assert!(cql_version_acceptable(&opts(&[("CQL_VERSION", "3.0.0")])));
        assert!(!cql_version_acceptable(&opts(&[("CQL_VERSION", "2.0.0")])));
        assert!(!cql_version_acceptable(&opts(&[("CQL_VERSION", "x")])));
        assert!(!cql_version_acceptable(&opts(&[("DRIVER_NAME", "d")])));
        let o = StartupOptIns::from_startup(&opts(&[
            ("CQL_VERSION", "4.0.0"),
            ("SCYLLA_RATE_LIMIT_ERROR", ""),
        ]));
        assert!(o.rate_limit_error);
        assert!(!o.lwt_metadata_mark);
    }
}
