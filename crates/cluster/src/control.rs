//! The Control class's inbound dispatcher: Raft messages and the other Control verbs (a node
//! asking to join) share the one Control inbound queue, so one task reads it and hands each
//! message to its verb's handler, each verb with its own bound on handlers running at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sluice_internode::{ConnectionClass, InboundMessage, InboundQueue, Status};
use sluice_meta::RpcHandler;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::raft_transport::{handle_raft_message, MAX_RAFT_HANDLERS};
use crate::verbs::VERB_RAFT;

/// The future a [`ControlHandler`] runs one message in.
pub type HandlerFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs one inbound message of a Control verb and answers it.
pub type ControlHandler = Arc<dyn Fn(InboundMessage) -> HandlerFuture + Send + Sync>;

/// A Control verb besides Raft, with its handler.
pub struct ControlVerb {
    /// The verb served.
    pub verb: u16,
    /// What runs each message of it.
    pub handler: ControlHandler,
    /// Messages of this verb handled at once; beyond it a message is answered `Overloaded`.
    pub max_running: usize,
}

/// Serves the messenger's Control inbound queue until the messenger shuts down: Raft messages
/// go to `raft`, each verb of `others` to its handler, any other verb is answered
/// `UnknownVerb`. Call it on a tokio runtime: the service and its handlers are spawned there.
pub fn serve_control(
    mut control: InboundQueue,
    raft: RpcHandler,
    others: Vec<ControlVerb>,
) -> JoinHandle<()> {
    debug_assert_eq!(control.class(), ConnectionClass::Control);
    debug_assert!(others.iter().all(|v| v.verb != VERB_RAFT));
    let raft_running = Arc::new(Semaphore::new(MAX_RAFT_HANDLERS));
    let others: Vec<(ControlVerb, Arc<Semaphore>)> = others
        .into_iter()
        .map(|v| {
            let running = Arc::new(Semaphore::new(v.max_running.max(1)));
            (v, running)
        })
        .collect();
    tokio::spawn(async move {
        while let Some(message) = control.recv().await {
            if message.verb == VERB_RAFT {
                // A forwarded proposal waits for its commit: each message runs in its own task
                // so that heartbeats are not held behind it.
                let Ok(permit) = Arc::clone(&raft_running).try_acquire_owned() else {
                    message.reply_status(Status::Overloaded);
                    continue;
                };
                let raft = raft.clone();
                tokio::spawn(async move {
                    handle_raft_message(&raft, message).await;
                    drop(permit);
                });
                continue;
            }
            let Some((verb, running)) = others.iter().find(|(v, _)| v.verb == message.verb) else {
                message.reply_status(Status::UnknownVerb);
                continue;
            };
            let Ok(permit) = Arc::clone(running).try_acquire_owned() else {
                message.reply_status(Status::Overloaded);
                continue;
            };
            let run = (verb.handler)(message);
            tokio::spawn(async move {
                run.await;
                drop(permit);
            });
        }
    })
}
