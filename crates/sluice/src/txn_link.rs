//! Joins the engine's transactions to the cluster's transaction log: the engine writes every
//! committed transaction it replicates (`sluice_cluster::TxnFollower`), and its transactions
//! and LWT are proposed through one committer per node that batches what is ready into one
//! proposal (`sluice_engine::transaction::replicated::TxnLog`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sluice_cluster::txn_log::MAX_BATCH_TRANSACTIONS;
use sluice_cluster::{
    ClusterMeta, ClusterNode, PartitionRef, TxnBatch, TxnCommit, TxnFollower, TxnOutcome,
    TxnProposal, TxnResponse,
};
use sluice_engine::transaction::replicated::{
    LoggedDecision, LoggedPartition, LoggedTxn, TxnLog, TxnLogError, TxnLogFuture,
};
use sluice_engine::Engine;
use sluice_meta::{MetaError, MetaLog};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

/// Transactions waiting for the committer; over it a transaction is refused at once.
const COMMITTER_QUEUE: usize = 4096;

/// Room in a command for the batch header and the partitions of a transaction.
const PARTITION_ROOM: usize = 4096;

/// The file whose presence says this node's storage may lack logged commits: it installed
/// a snapshot from another node. It outlives restarts (the storage still lacks them).
const MISSED_COMMITS_MARKER: &str = "txn-commits-missed";

/// Has `engine` write every committed transaction it replicates, from the ones replayed at
/// start-up on. Called before the CQL port opens, once the engine has the group's schema.
pub fn follow(engine: &Arc<Engine>, cluster: &ClusterNode, data_dir: &Path) {
    let marker = data_dir.join(MISSED_COMMITS_MARKER);
    if marker.exists() {
        engine.note_logged_commits_skipped(0);
    }
    let follower = Arc::new(EngineTxnFollower {
        engine: Arc::clone(engine),
        marker,
    });
    cluster
        .meta()
        .with_state(|s| s.txn().attach(follower as Arc<dyn TxnFollower>));
}

/// Routes `engine`'s transactions and LWT through the group, with a committer on `runtime`.
pub fn connect(engine: &Arc<Engine>, cluster: &ClusterNode, runtime: &Handle) {
    let (jobs, queue) = mpsc::channel(COMMITTER_QUEUE);
    let max_command_bytes = cluster.schema_client().max_command_bytes();
    runtime.spawn(commit_loop(
        Arc::clone(cluster.meta()),
        queue,
        max_command_bytes,
    ));
    engine.set_txn_log(Arc::new(GroupTxnLog {
        meta: Arc::clone(cluster.meta()),
        runtime: runtime.clone(),
        jobs,
        max_command_bytes,
    }));
}

/// The engine, as the log's follower.
struct EngineTxnFollower {
    engine: Arc<Engine>,
    marker: PathBuf,
}

impl TxnFollower for EngineTxnFollower {
    fn commit(&self, commit: &TxnCommit<'_>) {
        self.engine
            .apply_logged_commit(commit.timestamp, commit.provisional, commit.mutations);
    }

    fn make_durable(&self) {
        self.engine.make_logged_commits_durable();
    }

    fn skipped(&self, index: u64) {
        if let Err(e) = write_marker(&self.marker) {
            tracing::error!(error = %e, "cannot record that transaction writes were skipped");
        }
        self.engine.note_logged_commits_skipped(index);
    }
}

/// Creates the marker file and makes it durable.
fn write_marker(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    file.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// One transaction waiting for the committer.
struct Job {
    txn: TxnProposal,
    deadline: Instant,
    reply: oneshot::Sender<Result<TxnOutcome, TxnLogError>>,
}

/// The group, as the engine's transaction log.
struct GroupTxnLog {
    meta: Arc<ClusterMeta>,
    runtime: Handle,
    jobs: mpsc::Sender<Job>,
    max_command_bytes: usize,
}

fn meta_error(error: MetaError) -> TxnLogError {
    match error {
        MetaError::TooLarge => TxnLogError::TooLarge,
        MetaError::Timeout => TxnLogError::Timeout,
        other => TxnLogError::Unavailable(other.message()),
    }
}

fn partition(p: &LoggedPartition) -> PartitionRef {
    PartitionRef {
        table: p.table,
        token: p.token,
        key_hash: p.key_hash,
    }
}

impl TxnLog for GroupTxnLog {
    fn read_barrier(&self, deadline: Instant) -> TxnLogFuture<Result<u64, TxnLogError>> {
        let meta = Arc::clone(&self.meta);
        let task = self.runtime.spawn(async move {
            tokio::time::timeout_at(deadline.into(), meta.read_barrier()).await
        });
        Box::pin(async move {
            match task.await {
                Ok(Ok(Ok(index))) => Ok(index),
                Ok(Ok(Err(error))) => Err(meta_error(error)),
                Ok(Err(_elapsed)) => Err(TxnLogError::Timeout),
                Err(_) => Err(meta_error(MetaError::Stopped)),
            }
        })
    }

    fn last_applied(&self) -> u64 {
        self.meta.last_applied()
    }

    fn submit(
        &self,
        txn: LoggedTxn,
        deadline: Instant,
    ) -> TxnLogFuture<Result<LoggedDecision, TxnLogError>> {
        let txn = TxnProposal {
            read_at: txn.read_at,
            provisional: txn.provisional,
            reads: txn.reads.iter().map(partition).collect(),
            writes: txn.writes.iter().map(partition).collect(),
            mutations: txn.mutations.to_vec(),
            keeps_timestamps: txn.keeps_timestamps,
        };
        if 4 + txn.encoded_len() > self.max_command_bytes {
            return Box::pin(async { Err(TxnLogError::TooLarge) });
        }
        let (reply, answer) = oneshot::channel();
        let queued = self.jobs.try_send(Job {
            txn,
            deadline,
            reply,
        });
        Box::pin(async move {
            if queued.is_err() {
                return Err(TxnLogError::Unavailable(
                    "the transaction committer's queue is full",
                ));
            }
            match tokio::time::timeout_at(deadline.into(), answer).await {
                Ok(Ok(Ok(TxnOutcome::Committed { timestamp }))) => {
                    Ok(LoggedDecision::Committed { timestamp })
                }
                Ok(Ok(Ok(TxnOutcome::Conflict))) => Ok(LoggedDecision::Conflict),
                Ok(Ok(Err(error))) => Err(error),
                Ok(Err(_dropped)) => Err(meta_error(MetaError::Stopped)),
                Err(_elapsed) => Err(TxnLogError::Timeout),
            }
        })
    }

    fn max_txn_bytes(&self) -> usize {
        self.max_command_bytes.saturating_sub(PARTITION_ROOM)
    }
}

/// The per-node committer: takes every transaction ready when the previous proposal is
/// answered and proposes them as one batch (RavenDB's transaction merger), so concurrent
/// transactions share one Raft round trip and one log fsync.
async fn commit_loop(meta: Arc<ClusterMeta>, mut queue: mpsc::Receiver<Job>, max_bytes: usize) {
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match queue.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let mut jobs = vec![first];
        let mut bytes = 4 + jobs[0].txn.encoded_len();
        while jobs.len() < MAX_BATCH_TRANSACTIONS {
            let Ok(job) = queue.try_recv() else { break };
            if bytes + job.txn.encoded_len() > max_bytes {
                carried = Some(job);
                break;
            }
            bytes += job.txn.encoded_len();
            jobs.push(job);
        }
        // A transaction whose caller has given up is not proposed.
        let now = Instant::now();
        let (live, late): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|j| j.deadline > now && !j.reply.is_closed());
        for job in late {
            let _ = job.reply.send(Err(TxnLogError::Timeout));
        }
        if live.is_empty() {
            continue;
        }
        let deadline = live.iter().map(|j| j.deadline).max().expect("not empty");
        let mut replies = Vec::with_capacity(live.len());
        let mut batch = TxnBatch::default();
        for job in live {
            batch.transactions.push(job.txn);
            replies.push(job.reply);
        }
        let Some(command) = batch.encode() else {
            for reply in replies {
                let _ = reply.send(Err(TxnLogError::TooLarge));
            }
            continue;
        };
        debug_assert!(command.len() <= max_bytes);
        let proposed = tokio::time::timeout_at(
            deadline.into(),
            meta.propose(meta.next_request_id(), command),
        )
        .await;
        let answer = match proposed {
            Ok(Ok(committed)) => match TxnResponse::decode(&committed.response) {
                Ok(TxnResponse::Outcomes(outcomes)) if outcomes.len() == replies.len() => {
                    Ok(outcomes)
                }
                _ => Err(TxnLogError::Unavailable(
                    "the transaction log refused a batch",
                )),
            },
            Ok(Err(error)) => Err(meta_error(error)),
            Err(_elapsed) => Err(TxnLogError::Timeout),
        };
        match answer {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(error) => {
                for reply in replies {
                    let _ = reply.send(Err(error));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_written_and_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join(MISSED_COMMITS_MARKER);
        assert!(!marker.exists());
        write_marker(&marker).unwrap();
        assert!(marker.exists());
        // Writing it again (a second snapshot install) keeps it.
        write_marker(&marker).unwrap();
        assert!(marker.exists());
    }
}
