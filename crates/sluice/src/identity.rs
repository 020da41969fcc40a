//! The node's cluster identity, kept in its data directory: the host id (`host_id`) and
//! the cluster name, data center and rack (`identity`). Both are written once when the
//! directory is new, so they survive restarts; a restart with another cluster name, data
//! center or rack is refused, as Cassandra refuses it. Tokens are not kept here: the topology
//! group allocates them and is their only record (a `tokens` line of an older file is ignored).

use crate::config::ClusterSettings;
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::Path;

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
}

const IDENTITY_FILE: &str = "identity";
const HOST_ID_FILE: &str = "host_id";

/// Reads the node's identity from `dir`, or creates it from `settings`.
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
            let id = NodeIdentity {
                host_id,
                cluster_name: settings.cluster_name.clone(),
                dc: settings.dc.clone(),
                rack: settings.rack.clone(),
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
    Ok(())
}

fn render(id: &NodeIdentity) -> String {
    format!(
        "cluster_name={}\ndc={}\nrack={}\n",
        id.cluster_name, id.dc, id.rack
    )
}

fn parse(text: &str, host_id: uuid::Uuid) -> Result<NodeIdentity> {
    let (mut cluster_name, mut dc, mut rack) = (None, None, None);
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (k, v) = line.split_once('=').context("a line without '='")?;
        match k {
            "cluster_name" => cluster_name = Some(v.to_string()),
            "dc" => dc = Some(v.to_string()),
            "rack" => rack = Some(v.to_string()),
            // Written by versions that allocated tokens here; the topology group has them now.
            "tokens" => {}
            _ => bail!("unknown key {k:?}"),
        }
    }
    Ok(NodeIdentity {
        host_id,
        cluster_name: cluster_name.context("no cluster_name")?,
        dc: dc.context("no dc")?,
        rack: rack.context("no rack")?,
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
        let mut other_count = settings();
        other_count.num_tokens = 4;
        let again = load_or_create(dir.path(), &other_count).unwrap();
        assert_eq!(first, again, "host id and names are kept");
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
    fn distinct_directories_get_distinct_host_ids() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let ida = load_or_create(a.path(), &settings()).unwrap().host_id;
        let idb = load_or_create(b.path(), &settings()).unwrap().host_id;
        assert_ne!(ida, idb);
    }

    #[test]
    fn an_older_file_with_tokens_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), &settings()).unwrap();
        std::fs::write(
            dir.path().join(IDENTITY_FILE),
            "cluster_name=Test Cluster\ndc=dc1\nrack=r1\ntokens=5,-7\n",
        )
        .unwrap();
        assert_eq!(load_or_create(dir.path(), &settings()).unwrap(), first);
    }

    #[test]
    fn corrupt_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create(dir.path(), &settings()).unwrap();
        for bad in ["", "cluster_name=x\n", "cluster_name=a\ndc=b\n", "x=y\n"] {
            std::fs::write(dir.path().join(IDENTITY_FILE), bad).unwrap();
            assert!(load_or_create(dir.path(), &settings()).is_err(), "{bad:?}");
        }
    }
}
