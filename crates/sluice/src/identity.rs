//! The node's cluster identity, kept in its data directory: the host id (`host_id`) and
//! the cluster name, data center, rack and tokens (`identity`). Both are written once when
//! the directory is new, so they survive restarts; a restart with another cluster name,
//! data center or rack is refused, as Cassandra refuses it.

use crate::config::ClusterSettings;
use anyhow::{bail, Context, Result};
use sluice_ring::{allocate_tokens, Token, TokenMetadata};
use std::io::Write;
use std::path::Path;
use tracing::warn;

/// Who this node is in its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// Stable host id.
    pub host_id: uuid::Uuid,
    /// Cluster name.
    pub cluster_name: String,
    /// Data center.
    pub dc: String,
    /// Rack.
    pub rack: String,
    /// The node's tokens, sorted.
    pub tokens: Vec<Token>,
}

const IDENTITY_FILE: &str = "identity";
const HOST_ID_FILE: &str = "host_id";

/// Reads the node's identity from `dir`, or creates it from `settings` (allocating
/// `num_tokens` tokens for a single-node ring, seeded by the host id).
pub fn load_or_create(dir: &Path, settings: &ClusterSettings) -> Result<NodeIdentity> {
    let host_id = load_or_create_host_id(dir)?;
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = parse(&text, host_id)
                .with_context(|| format!("corrupt identity file {}", path.display()))?;
            check_unchanged(&id, settings)?;
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let empty = TokenMetadata::new(Vec::new()).context("empty ring")?;
            let seed = host_id.as_u64_pair();
            let tokens = allocate_tokens(&empty, settings.num_tokens, seed.0 ^ seed.1)
                .map_err(|e| anyhow::anyhow!("cannot allocate tokens: {e}"))?;
            let id = NodeIdentity {
                host_id,
                cluster_name: settings.cluster_name.clone(),
                dc: settings.dc.clone(),
                rack: settings.rack.clone(),
                tokens,
            };
            write_atomically(dir, IDENTITY_FILE, &render(&id))?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// A data directory belongs to one cluster, data center and rack for its whole life.
fn check_unchanged(id: &NodeIdentity, settings: &ClusterSettings) -> Result<()> {
    if id.cluster_name != settings.cluster_name {
        bail!(
            "saved cluster name {:?} != configured name {:?}: this data directory belongs \
             to another cluster",
            id.cluster_name,
            settings.cluster_name
        );
    }
    if id.dc != settings.dc || id.rack != settings.rack {
        bail!(
            "cannot start with data center {:?} and rack {:?}: this node was created in \
             data center {:?}, rack {:?}, and moving it would misplace its replicas",
            settings.dc,
            settings.rack,
            id.dc,
            id.rack
        );
    }
    if id.tokens.len() != settings.num_tokens {
        warn!(
            saved = id.tokens.len(),
            configured = settings.num_tokens,
            "num-tokens applies only to a new node; keeping the saved tokens"
        );
    }
    Ok(())
}

fn render(id: &NodeIdentity) -> String {
    let tokens: Vec<String> = id.tokens.iter().map(Token::to_string).collect();
    format!(
        "cluster_name={}\ndc={}\nrack={}\ntokens={}\n",
        id.cluster_name,
        id.dc,
        id.rack,
        tokens.join(",")
    )
}

fn parse(text: &str, host_id: uuid::Uuid) -> Result<NodeIdentity> {
    let (mut cluster_name, mut dc, mut rack, mut tokens) = (None, None, None, None);
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (k, v) = line.split_once('=').context("a line without '='")?;
        match k {
            "cluster_name" => cluster_name = Some(v.to_string()),
            "dc" => dc = Some(v.to_string()),
            "rack" => rack = Some(v.to_string()),
            "tokens" => {
                let mut ts = v
                    .split(',')
                    .map(|t| t.parse::<Token>())
                    .collect::<Result<Vec<Token>, _>>()
                    .context("bad token")?;
                ts.sort_unstable();
                if ts.is_empty() || ts.contains(&Token::MIN) || ts.windows(2).any(|w| w[0] == w[1])
                {
                    bail!("tokens must be distinct and never -2^63");
                }
                tokens = Some(ts);
            }
            _ => bail!("unknown key {k:?}"),
        }
    }
    Ok(NodeIdentity {
        host_id,
        cluster_name: cluster_name.context("no cluster_name")?,
        dc: dc.context("no dc")?,
        rack: rack.context("no rack")?,
        tokens: tokens.context("no tokens")?,
    })
}

/// The node's host id: stable across restarts, kept in `<data_dir>/host_id`.
fn load_or_create_host_id(dir: &Path) -> Result<uuid::Uuid> {
    let path = dir.join(HOST_ID_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        return uuid::Uuid::parse_str(text.trim())
            .with_context(|| format!("corrupt host id file {}", path.display()));
    }
    let id = uuid::Uuid::new_v4();
    write_atomically(dir, HOST_ID_FILE, &id.to_string())?;
    Ok(id)
}

/// Writes `name` in `dir` through a synced temporary file and a rename, so that a crash
/// leaves the old file or the new one, never a torn one.
fn write_atomically(dir: &Path, name: &str, contents: &str) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(contents.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(name)).with_context(|| format!("cannot write {name}"))?;
    if let Ok(d) = std::fs::File::open(dir) {
        // The rename is durable once the directory is synced (best effort off Unix).
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ClusterSettings {
        ClusterSettings {
            internode_listen: ([127, 0, 0, 1], 7000).into(),
            seeds: Vec::new(),
            cluster_name: "Test Cluster".into(),
            dc: "dc1".into(),
            rack: "r1".into(),
            num_tokens: 16,
        }
    }

    #[test]
    fn identity_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), &settings()).unwrap();
        assert_eq!(first.tokens.len(), 16);
        assert!(first.tokens.windows(2).all(|w| w[0] < w[1]));
        let mut other_count = settings();
        other_count.num_tokens = 4;
        let again = load_or_create(dir.path(), &other_count).unwrap();
        assert_eq!(first, again, "tokens and host id are kept");
    }

    #[test]
    fn another_cluster_dc_or_rack_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create(dir.path(), &settings()).unwrap();
        for change in [
            |s: &mut ClusterSettings| s.cluster_name = "Other".into(),
            |s: &mut ClusterSettings| s.dc = "dc2".into(),
            |s: &mut ClusterSettings| s.rack = "r2".into(),
        ] {
            let mut s = settings();
            change(&mut s);
            assert!(load_or_create(dir.path(), &s).is_err());
        }
    }

    #[test]
    fn distinct_nodes_get_distinct_tokens() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let ta = load_or_create(a.path(), &settings()).unwrap().tokens;
        let tb = load_or_create(b.path(), &settings()).unwrap().tokens;
        assert_ne!(ta, tb, "seeded by the host id");
    }

    #[test]
    fn corrupt_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create(dir.path(), &settings()).unwrap();
        for bad in [
            "",
            "cluster_name=x\n",
            "tokens=1,1\ncluster_name=a\ndc=b\nrack=c\n",
            "tokens=-9223372036854775808\ncluster_name=a\ndc=b\nrack=c\n",
            "x=y\n",
        ] {
            std::fs::write(dir.path().join(IDENTITY_FILE), bad).unwrap();
            assert!(load_or_create(dir.path(), &settings()).is_err(), "{bad:?}");
        }
    }
}
