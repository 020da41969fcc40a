//! What `sluice serve` sets for its own process: transparent huge pages are off unless asked
//! for (a fresh 2 MiB page stalls the shard that touches it; see `sluice_alloc`).

mod common;

use common::Node;

/// The kernel's view of the process: `THP_enabled` in `/proc/PID/status` (Linux 6.0 and
/// later), `None` where the field does not exist.
fn thp_enabled(node: &Node) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.child.id())).ok()?;
    let line = status.lines().find(|l| l.starts_with("THP_enabled:"))?;
    Some(line.split_whitespace().nth(1)? == "1")
}

#[test]
fn transparent_huge_pages_are_off_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let default = Node::start(&dir.path().join("default"), 1, &[]);
    let Some(enabled) = thp_enabled(&default) else {
        eprintln!("this kernel does not report THP_enabled; nothing to check");
        return;
    };
    assert!(!enabled, "huge pages are on by default");
    drop(default);
    let asked = Node::start(
        &dir.path().join("asked"),
        1,
        &["--transparent-huge-pages", "on"],
    );
    assert_eq!(thp_enabled(&asked), Some(true), "the option was ignored");
}
