//! LOGGED batches whose partitions have different replica sets, made atomic across replicas
//! through the cluster's transaction log, which here plays Cassandra's batchlog.
//!
//! The coordinator checks liveness at the consistency level (Unavailable before anything is
//! written), commits the batch to the log as an unconditional transaction that keeps its
//! timestamps, then sends the mutations to their replicas and waits for the level as any
//! write does. Once committed, every node applies the batch's parts it replicates when it
//! applies the log (a node that was down does so when it catches up), so a coordinator that
//! dies after the commit still leaves the batch applied whole.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use sluice_protocol::{Consistency, DbError, DetailedError, WriteType};
use sluice_storage::Mutation;

use crate::analyze::WritePlan;
use crate::catalog::TableDef;
use crate::coordinator::{self, ReplicaTransport};
use crate::exec::Binder;
use crate::transaction::replicated::{self, LoggedDecision, LoggedPartition, LoggedTxn, TxnLog};
use crate::Engine;

/// Why a logged batch does not go through the log.
fn too_large() -> DetailedError {
    crate::catalog::invalid(
        "A LOGGED batch over partitions with different replicas must fit one transaction log \
         entry (the metadata group's max_command_bytes, 64 KiB by default, less 4 KiB for its \
         partitions); split the batch or use an UNLOGGED batch",
    )
}

/// The Write_timeout of a batch whose log write was not confirmed in time (it may still be
/// applied, as Cassandra's BATCH_LOG says).
fn log_timeout(consistency: Consistency, block_for: u32) -> DetailedError {
    DetailedError::new(
        DbError::WriteTimeout {
            consistency,
            received: 0,
            block_for: block_for as i32,
            write_type: WriteType::BatchLog,
        },
        "Operation timed out - the batch log write was not confirmed in time",
    )
}

/// What a LOGGED batch over several replica sets goes through.
pub(crate) struct Route<'e> {
    log: &'e Arc<dyn TxnLog>,
    transport: &'e Arc<dyn ReplicaTransport>,
}

/// The route of a LOGGED batch of `muts` when it spans replica sets on a cluster with a
/// transaction log; `None` keeps the ordinary write path.
pub(crate) fn route<'e>(
    engine: &'e Engine,
    entries: &[(&WritePlan, &Binder<'_>)],
    muts: &[Mutation],
) -> Option<Route<'e>> {
    if muts.len() < 2 {
        return None;
    }
    let transport = engine.replica_transport()?;
    let tables: Vec<&TableDef> = entries.iter().map(|(w, _)| &*w.table).collect();
    let log = engine.txn_log_for(tables.iter().copied())?;
    coordinator::replica_sets_differ(engine, &tables, muts).then_some(Route { log, transport })
}

/// Runs a LOGGED batch through the log, then writes it to its replicas at `consistency`.
/// `Ok(Some(muts))` hands the mutations back when every replica is this node (the caller
/// applies them locally as before).
pub(crate) async fn execute(
    engine: &Engine,
    route: Route<'_>,
    entries: &[(&WritePlan, &Binder<'_>)],
    muts: Vec<Mutation>,
    batch_timestamp: i64,
    consistency: Consistency,
    ctx: &crate::RequestContext,
) -> Result<Option<Vec<Mutation>>, DetailedError> {
    let Route { log, transport } = route;
    let tables: Vec<&TableDef> = entries.iter().map(|(w, _)| &*w.table).collect();
    // Unavailable before anything is written, as Cassandra checks every mutation's replicas
    // before its batchlog write.
    let Some(fan) = coordinator::plan_write(engine, &tables, &muts, consistency)? else {
        return Ok(Some(muts));
    };
    let block_for = fan.block_for();
    let refs: Vec<&Mutation> = muts.iter().collect();
    let body = crate::replica_msg::encode_mutations(&refs, 0);
    if body.len() > log.max_txn_bytes() {
        return Err(too_large());
    }
    let mut writes: Vec<LoggedPartition> = muts.iter().map(replicated::partition_of).collect();
    writes.sort_by_key(|p| (p.table, p.token, p.key_hash));
    writes.dedup();
    let txn = LoggedTxn {
        read_at: log.last_applied(),
        provisional: batch_timestamp,
        reads: Vec::new(),
        writes,
        mutations: body,
        keeps_timestamps: true,
    };
    let deadline = ctx
        .deadline
        .unwrap_or_else(|| Instant::now() + coordinator::DEFAULT_WRITE_WAIT);
    match log.submit(txn, deadline).await {
        Ok(LoggedDecision::Committed { .. }) => {
            engine.txn_log_commits.fetch_add(1, Ordering::Relaxed);
        }
        Err(replicated::TxnLogError::TooLarge) => return Err(too_large()),
        // A batch reads nothing, so it never conflicts; if it did, nothing was written.
        Ok(LoggedDecision::Conflict)
        | Err(replicated::TxnLogError::Timeout | replicated::TxnLogError::Unavailable(_)) => {
            return Err(log_timeout(consistency, block_for));
        }
    }
    // Logged: from here every replica gets the batch from the log whatever happens to this
    // coordinator; the fan-out gives the level's answer (Write_timeout BATCH past the
    // deadline, as Cassandra answers once its batchlog is written).
    coordinator::run_write_fan_out(
        engine,
        transport,
        entries,
        &muts,
        fan,
        WriteType::Batch,
        ctx,
    )
    .await?;
    Ok(None)
}
