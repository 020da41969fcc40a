//! A keyspace's replication, parsed from the map stored in `system_schema.keyspaces`.

use std::collections::BTreeMap;
use std::fmt;

/// How a keyspace's data is replicated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replication {
    /// `LocalStrategy`: the system keyspaces, never replicated; each node serves its own.
    Local,
    /// `SimpleStrategy`: the first `factor` distinct nodes walking the ring.
    Simple {
        /// Replicas per token.
        factor: u32,
    },
    /// `NetworkTopologyStrategy`: per data center, Cassandra's rack-aware walk.
    NetworkTopology {
        /// (data center, replicas in it), sorted by name; DCs with factor 0 are dropped.
        factors: Vec<(String, u32)>,
    },
}

/// Why a replication map cannot be used for placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicationError {
    /// The map has no `class`.
    MissingClass,
    /// The class is not LocalStrategy, SimpleStrategy or NetworkTopologyStrategy.
    UnknownClass,
    /// SimpleStrategy without `replication_factor`.
    MissingFactor,
    /// A factor that is not a non-negative decimal integer (transient replicas, `3/1`,
    /// are not supported).
    InvalidFactor,
    /// An option the class does not take.
    UnexpectedOption,
}

impl ReplicationError {
    /// The error's message.
    pub fn message(self) -> &'static str {
        match self {
            ReplicationError::MissingClass => "the replication map has no class",
            ReplicationError::UnknownClass => "unknown replication strategy class",
            ReplicationError::MissingFactor => "SimpleStrategy requires a replication_factor",
            ReplicationError::InvalidFactor => {
                "a replication factor must be a non-negative integer"
            }
            ReplicationError::UnexpectedOption => "unexpected replication option for the class",
        }
    }
}

impl fmt::Display for ReplicationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ReplicationError {}

fn factor(v: &str) -> Result<u32, ReplicationError> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ReplicationError::InvalidFactor);
    }
    v.parse().map_err(|_| ReplicationError::InvalidFactor)
}

impl Replication {
    /// Parses a stored replication map, e.g. `{'class': 'SimpleStrategy',
    /// 'replication_factor': '3'}` or `{'class':
    /// 'org.apache.cassandra.locator.NetworkTopologyStrategy', 'dc1': '3', 'dc2': '2'}`.
    /// The class may be short or fully qualified. NTS's `replication_factor` shorthand is
    /// expanded per DC when the keyspace is created, so a stored map never has it.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Replication, ReplicationError> {
        let class = map.get("class").ok_or(ReplicationError::MissingClass)?;
        let short = class.rsplit('.').next().unwrap_or(class);
        let options = map.iter().filter(|(k, _)| k.as_str() != "class");
        match short {
            "LocalStrategy" => Ok(Replication::Local),
            "SimpleStrategy" => {
                let mut rf = None;
                for (k, v) in options {
                    if k != "replication_factor" {
                        return Err(ReplicationError::UnexpectedOption);
                    }
                    rf = Some(factor(v)?);
                }
                Ok(Replication::Simple {
                    factor: rf.ok_or(ReplicationError::MissingFactor)?,
                })
            }
            "NetworkTopologyStrategy" => {
                let mut factors = Vec::new();
                for (dc, v) in options {
                    if dc == "replication_factor" {
                        return Err(ReplicationError::UnexpectedOption);
                    }
                    let rf = factor(v)?;
                    if rf > 0 {
                        factors.push((dc.clone(), rf));
                    }
                }
                Ok(Replication::NetworkTopology { factors })
            }
            _ => Err(ReplicationError::UnknownClass),
        }
    }

    /// The replication factor asked for in a data center (before capping at its node count).
    pub fn factor_in(&self, dc: &str) -> u32 {
        match self {
            Replication::Local => 1,
            Replication::Simple { factor } => *factor,
            Replication::NetworkTopology { factors } => factors
                .iter()
                .find(|(name, _)| name == dc)
                .map_or(0, |(_, rf)| *rf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn short_and_qualified_class_names_parse() {
        let simple = Replication::from_map(&map(&[
            ("class", "SimpleStrategy"),
            ("replication_factor", "3"),
        ]));
        assert_eq!(simple, Ok(Replication::Simple { factor: 3 }));
        let nts = Replication::from_map(&map(&[
            (
                "class",
                "org.apache.cassandra.locator.NetworkTopologyStrategy",
            ),
            ("dc2", "2"),
            ("dc1", "3"),
            ("dc3", "0"),
        ]));
        assert_eq!(
            nts,
            Ok(Replication::NetworkTopology {
                factors: vec![("dc1".into(), 3), ("dc2".into(), 2)]
            })
        );
        let local = Replication::from_map(&map(&[(
            "class",
            "org.apache.cassandra.locator.LocalStrategy",
        )]));
        assert_eq!(local, Ok(Replication::Local));
        assert_eq!(nts.unwrap().factor_in("dc2"), 2);
    }

    #[test]
    fn malformed_maps_are_rejected() {
        let e = |pairs: &[(&str, &str)]| Replication::from_map(&map(pairs)).unwrap_err();
        assert_eq!(e(&[]), ReplicationError::MissingClass);
        assert_eq!(
            e(&[("class", "Everywhere")]),
            ReplicationError::UnknownClass
        );
        assert_eq!(
            e(&[("class", "SimpleStrategy")]),
            ReplicationError::MissingFactor
        );
        for bad in ["-1", "3/1", "", "x", "99999999999"] {
            assert_eq!(
                e(&[("class", "SimpleStrategy"), ("replication_factor", bad)]),
                ReplicationError::InvalidFactor,
                "{bad:?}"
            );
        }
        assert_eq!(
            e(&[
                ("class", "SimpleStrategy"),
                ("replication_factor", "1"),
                ("dc1", "1")
            ]),
            ReplicationError::UnexpectedOption
        );
        assert_eq!(
            e(&[
                ("class", "NetworkTopologyStrategy"),
                ("replication_factor", "3")
            ]),
            ReplicationError::UnexpectedOption
        );
    }
}
