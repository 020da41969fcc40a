//! `sluice nodetool`: an operator's commands to a running node, sent over its internode port
//! (`sluice_cluster::AdminRequest` on the Control class): `status`, `decommission`,
//! `removenode <host-id>`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use sluice_cluster::{ask_node, AdminReply, AdminRequest, NodeStatus, StreamTotals};
use uuid::Uuid;

/// Options of `sluice nodetool`.
#[derive(Debug, Args)]
pub struct NodetoolArgs {
    /// Internode address of the node to ask.
    #[arg(long, env = "SLUICE_NODETOOL_HOST", default_value = "127.0.0.1:7000")]
    pub host: SocketAddr,
    /// The cluster's name (nodes refuse connections from other clusters).
    #[arg(long, env = "SLUICE_CLUSTER_NAME", default_value = "Sluice Cluster")]
    pub cluster_name: String,
    /// Longest wait for the node's answer, in seconds (a decommission streams all its data).
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// What to do.
    #[command(subcommand)]
    pub command: NodetoolCommand,
}

/// `sluice nodetool` subcommands.
#[derive(Debug, Subcommand)]
pub enum NodetoolCommand {
    /// Every node of the ring: status and state (UN, UJ, UL, DN, ...), address, load,
    /// tokens, ownership, host id and rack.
    Status,
    /// Stream this node's ranges to the nodes that take them over, leave the ring, and stop.
    Decommission,
    /// Remove a dead node from the ring; its ranges are streamed again from their other
    /// replicas.
    Removenode {
        /// The dead node's host id.
        host_id: Uuid,
    },
}

/// Runs one nodetool command, printing its answer.
pub async fn run(args: NodetoolArgs) -> Result<()> {
    let request = match &args.command {
        NodetoolCommand::Status => AdminRequest::Status,
        NodetoolCommand::Decommission => AdminRequest::Decommission,
        NodetoolCommand::Removenode { host_id } => AdminRequest::RemoveNode { host_id: *host_id },
    };
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let reply = ask_node(&args.cluster_name, args.host, &request, deadline).await;
    let reply = match reply {
        Ok(reply) => reply,
        Err(why) => bail!("no answer from {}: {why}", args.host),
    };
    match reply {
        AdminReply::Status(nodes) => print!("{}", render_status(&nodes)),
        AdminReply::Done(totals) => println!("{}", render_totals(&args.command, &totals)),
        AdminReply::Refused(why) => bail!("{why}"),
    }
    Ok(())
}

fn render_totals(command: &NodetoolCommand, t: &StreamTotals) -> String {
    let what = match command {
        NodetoolCommand::Decommission => "decommissioned",
        _ => "removed",
    };
    format!(
        "{what}: {} ranges streamed ({} records, {} bytes), {} ranges failed",
        t.ranges, t.records, t.bytes, t.failed_ranges
    )
}

/// `nodetool status` as Cassandra prints it, one table per data center.
pub fn render_status(nodes: &[NodeStatus]) -> String {
    let mut dcs: Vec<&str> = nodes.iter().map(|n| n.dc.as_str()).collect();
    dcs.sort_unstable();
    dcs.dedup();
    let mut out = String::new();
    for dc in dcs {
        let title = format!("Datacenter: {dc}");
        let _ = writeln!(out, "{title}\n{}", "=".repeat(title.len()));
        out.push_str("Status=Up/Down\n|/ State=Normal/Leaving/Joining/Moving\n");
        let _ = writeln!(
            out,
            "--  {:<15} {:<11} {:<7} {:<8} {:<36}  Rack",
            "Address", "Load", "Tokens", "Owns", "Host ID"
        );
        let mut members: Vec<&NodeStatus> = nodes.iter().filter(|n| n.dc == dc).collect();
        members.sort_by_key(|n| n.cql_address.ip());
        for n in members {
            let up = if n.up { 'U' } else { 'D' };
            let state = match n.state.as_str() {
                "JOINING" => 'J',
                "LEAVING" => 'L',
                _ => 'N',
            };
            let load = n.load.map_or_else(|| "?".to_owned(), human_bytes);
            let _ = writeln!(
                out,
                "{up}{state}  {:<15} {:<11} {:<7} {:<8} {:<36}  {}",
                n.cql_address.ip().to_string(),
                load,
                n.tokens,
                format!("{:.1}%", n.owns * 100.0),
                n.host_id,
                n.rack
            );
        }
        out.push('\n');
    }
    out
}

/// Bytes as Cassandra's nodetool prints them (`104.34 KiB`).
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: u8, state: &str, up: bool) -> NodeStatus {
        NodeStatus {
            host_id: Uuid::from_u128(u128::from(i)),
            cql_address: format!("127.0.0.{i}:9042").parse().unwrap(),
            internode_address: format!("127.0.0.{i}:7000").parse().unwrap(),
            dc: "datacenter1".to_owned(),
            rack: "rack1".to_owned(),
            state: state.to_owned(),
            up,
            load: up.then_some(2048 + u64::from(i)),
            tokens: 16,
            owns: 0.25,
        }
    }

    #[test]
    fn status_prints_one_line_per_node_with_cassandras_codes() {
        let text = render_status(&[
            node(2, "JOINING", true),
            node(1, "NORMAL", true),
            node(3, "LEAVING", true),
            node(4, "NORMAL", false),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Datacenter: datacenter1");
        assert!(lines[4].starts_with("--  Address"));
        let rows: Vec<Vec<&str>> = lines[5..9]
            .iter()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0][..2], ["UN", "127.0.0.1"]);
        assert_eq!(rows[1][..2], ["UJ", "127.0.0.2"]);
        assert_eq!(rows[2][..2], ["UL", "127.0.0.3"]);
        assert_eq!(rows[3][..4], ["DN", "127.0.0.4", "?", "16"]);
        assert_eq!(rows[0][2..6], ["2.00", "KiB", "16", "25.0%"]);
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(3 << 20), "3.00 MiB");
    }
}
