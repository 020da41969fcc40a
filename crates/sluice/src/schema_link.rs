//! Joins the engine's schema to the cluster's metadata group: the engine follows the group's
//! schema (installing every accepted change), and its DDL goes through the group.
//!
//! The engine and the cluster layer do not know each other; this is the seam between their
//! traits (`sluice_engine::schema_group::SchemaLog`, `sluice_cluster::SchemaFollower`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use sluice_cluster::{
    ClusterNode, SchemaClient, SchemaCommand, SchemaEdit, SchemaFollower, SchemaResponse,
};
use sluice_engine::schema_group::{
    CommitOutcome, DocumentEdit, SchemaLog, SchemaLogError, SchemaLogFuture,
};
use sluice_engine::Engine;
use sluice_meta::MetaError;
use tokio::runtime::Handle;
use tracing::info;

/// How long a start may take to propose a local schema as the group's first one.
const SEED_TIMEOUT: Duration = Duration::from_secs(60);

/// Has `engine` follow the group's schema, proposes its local schema when the group has none,
/// then routes its DDL through the group. Called before the CQL port opens.
pub fn connect(engine: &Arc<Engine>, cluster: &ClusterNode, runtime: &Handle) -> Result<()> {
    let epoch = cluster.follow_schema(Arc::new(EngineFollower(Arc::clone(engine))));
    let log = GroupSchemaLog {
        client: cluster.schema_client(),
        runtime: runtime.clone(),
    };
    let proposed = runtime
        .block_on(engine.seed_schema_group(&log, Instant::now() + SEED_TIMEOUT))
        .map_err(|e| anyhow::anyhow!("cannot propose the local schema to the group: {e:?}"))?;
    if proposed > 0 {
        info!(
            definitions = proposed,
            "proposed the local schema as the group's first"
        );
    }
    info!(
        epoch,
        version = %engine.schema_version(),
        "following the group's schema"
    );
    engine.set_schema_log(Arc::new(log));
    Ok(())
}

/// The engine, as the group's schema follower.
struct EngineFollower(Arc<Engine>);

impl SchemaFollower for EngineFollower {
    fn applied(&self, epoch: u64, edits: &[SchemaEdit], documents: &BTreeMap<String, String>) {
        self.0.apply_group_edits(
            epoch,
            edits.iter().map(|e| (e.key(), e.value())),
            documents.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
    }

    fn replaced(&self, epoch: u64, documents: &BTreeMap<String, String>) {
        self.0.install_group_schema(
            epoch,
            documents.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
    }
}

/// The group, as the engine's schema log. Calls run on the cluster runtime, whatever
/// runtime the caller (a shard) awaits them on.
struct GroupSchemaLog {
    client: SchemaClient,
    runtime: Handle,
}

fn unavailable(error: MetaError) -> SchemaLogError {
    match error {
        MetaError::TooLarge => SchemaLogError::TooLarge,
        other => SchemaLogError::Unavailable(other.message()),
    }
}

impl SchemaLog for GroupSchemaLog {
    fn read_barrier(&self, deadline: Instant) -> SchemaLogFuture<()> {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            tokio::time::timeout_at(deadline.into(), client.read_barrier()).await
        });
        Box::pin(async move {
            match task.await {
                Ok(Ok(Ok(_epoch))) => Ok(()),
                Ok(Ok(Err(error))) => Err(unavailable(error)),
                Ok(Err(_elapsed)) => Err(unavailable(MetaError::Timeout)),
                Err(_) => Err(unavailable(MetaError::Stopped)),
            }
        })
    }

    fn commit(
        &self,
        base: u64,
        edits: Vec<DocumentEdit>,
        deadline: Instant,
    ) -> SchemaLogFuture<CommitOutcome> {
        let command = SchemaCommand {
            base,
            edits: edits
                .into_iter()
                .map(|e| match e.value {
                    Some(value) => SchemaEdit::Put { key: e.key, value },
                    None => SchemaEdit::Delete { key: e.key },
                })
                .collect(),
        };
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            tokio::time::timeout_at(deadline.into(), client.propose(&command)).await
        });
        Box::pin(async move {
            match task.await {
                Ok(Ok(Ok(SchemaResponse::Applied { .. }))) => Ok(CommitOutcome::Applied),
                Ok(Ok(Ok(SchemaResponse::Stale { .. }))) => Ok(CommitOutcome::Stale),
                Ok(Ok(Ok(SchemaResponse::Rejected(why)))) => {
                    Err(SchemaLogError::Refused(why.message()))
                }
                Ok(Ok(Err(error))) => Err(unavailable(error)),
                // The proposal may still be applied later, as a timeout allows.
                Ok(Err(_elapsed)) => Err(unavailable(MetaError::Timeout)),
                Err(_) => Err(unavailable(MetaError::Stopped)),
            }
        })
    }

    fn max_edit_bytes(&self) -> usize {
        self.client.max_command_bytes()
    }
}
