//! Failure detection by pings on the Control class.
//!
//! Every `ping_interval` each watched peer is pinged with a deadline of `down_after`. A peer is
//! up from its first pong and down once no pong has arrived for `down_after`; subscribers get
//! each change. Pings are answered by the peer's connection reader ahead of every handler
//! queue, so a peer that is busy but alive stays up while a stopped or dead one goes down.
//!
//! Silence is counted only while this detector runs: a round that comes much later than its
//! tick means this node was not running (descheduled by the OS, its runtime's threads busy),
//! and the pongs of that time are still unread, so that pause is not held against the peers.

use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, watch};

use crate::messenger::{Messenger, Shared};

/// Capacity of the change channel; a subscriber that lags further learns it from `Lagged` and
/// can re-read every peer with [`FailureDetector::is_up`].
const EVENT_CAPACITY: usize = 1024;

/// How often to ping and how long a silence means down.
#[derive(Debug, Clone, Copy)]
pub struct FailureDetectorConfig {
    /// Time between pings to each peer.
    pub ping_interval: Duration,
    /// A peer with no pong for this long is down.
    pub down_after: Duration,
}

impl Default for FailureDetectorConfig {
    fn default() -> Self {
        FailureDetectorConfig {
            ping_interval: Duration::from_millis(100),
            down_after: Duration::from_secs(1),
        }
    }
}

/// A peer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Answering pings.
    Up,
    /// Silent for longer than `down_after`, or never answered yet.
    Down,
}

/// One change of a peer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessChange {
    /// The peer's internode address.
    pub peer: SocketAddr,
    /// Its new state.
    pub liveness: Liveness,
    /// When the detector decided.
    pub at: Instant,
}

#[derive(Debug, Clone, Copy)]
struct PeerState {
    liveness: Liveness,
    last_pong: Option<Instant>,
    last_rtt: Option<Duration>,
    watched_since: Instant,
}

struct Detector {
    config: FailureDetectorConfig,
    peers: Mutex<HashMap<SocketAddr, PeerState>>,
    events: broadcast::Sender<LivenessChange>,
    /// Wakes the ping loop for a round before its next tick.
    wake: tokio::sync::Notify,
}

/// Pings peers and tracks which are up. Dropping it stops the pings.
pub struct FailureDetector {
    detector: Arc<Detector>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

impl FailureDetector {
    /// Starts pinging through `messenger`, on its runtime; no peers yet.
    pub fn start(messenger: &Messenger, config: FailureDetectorConfig) -> FailureDetector {
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let detector = Arc::new(Detector {
            config,
            peers: Mutex::new(HashMap::new()),
            events,
            wake: tokio::sync::Notify::new(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let shared = messenger.shared();
        shared
            .runtime()
            .spawn(ping_loop(detector.clone(), shared.clone(), stop_rx));
        FailureDetector {
            detector,
            shared: shared.clone(),
            stop,
        }
    }

    /// Starts watching `peer`; it is down until its first pong.
    pub fn watch(&self, peer: SocketAddr) {
        lock(&self.detector.peers)
            .entry(peer)
            .or_insert_with(|| PeerState {
                liveness: Liveness::Down,
                last_pong: None,
                last_rtt: None,
                watched_since: Instant::now(),
            });
    }

    /// Stops watching `peer`.
    pub fn unwatch(&self, peer: SocketAddr) {
        lock(&self.detector.peers).remove(&peer);
    }

    /// True if `peer` is watched and up.
    pub fn is_up(&self, peer: SocketAddr) -> bool {
        lock(&self.detector.peers)
            .get(&peer)
            .is_some_and(|state| state.liveness == Liveness::Up)
    }

    /// The round-trip time of `peer`'s latest pong.
    pub fn last_rtt(&self, peer: SocketAddr) -> Option<Duration> {
        lock(&self.detector.peers)
            .get(&peer)
            .and_then(|state| state.last_rtt)
    }

    /// The latest heartbeat (`Messenger::set_heartbeat`) a watched `peer` sent with a ping or
    /// answered one with.
    pub fn heartbeat(&self, peer: SocketAddr) -> Option<Bytes> {
        if !lock(&self.detector.peers).contains_key(&peer) {
            return None;
        }
        self.shared.peer_heartbeat(peer)
    }

    /// Pings every watched peer now rather than at the next tick (each ping carries this
    /// node's heartbeat, so a change reaches the peers within a round trip).
    pub fn ping_now(&self) {
        self.detector.wake.notify_one();
    }

    /// Every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<LivenessChange> {
        self.detector.events.subscribe()
    }
}

impl Drop for FailureDetector {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Detector {
    fn on_pong(&self, peer: SocketAddr, rtt: Duration) {
        let now = Instant::now();
        let mut peers = lock(&self.peers);
        let Some(state) = peers.get_mut(&peer) else {
            return;
        };
        state.last_pong = Some(now);
        state.last_rtt = Some(rtt);
        if state.liveness == Liveness::Down {
            state.liveness = Liveness::Up;
            let _ = self.events.send(LivenessChange {
                peer,
                liveness: Liveness::Up,
                at: now,
            });
        }
    }

    /// Marks down every up peer silent for longer than `down_after`, not counting `paused`, the
    /// time just before `now` when this detector itself did not run.
    fn check(&self, now: Instant, paused: Duration) {
        let mut peers = lock(&self.peers);
        for (&peer, state) in peers.iter_mut() {
            if !paused.is_zero() {
                state.last_pong = state.last_pong.map(|t| (t + paused).min(now));
                state.watched_since = (state.watched_since + paused).min(now);
            }
            let heard = state.last_pong.unwrap_or(state.watched_since);
            if state.liveness == Liveness::Up
                && now.saturating_duration_since(heard) > self.config.down_after
            {
                state.liveness = Liveness::Down;
                let _ = self.events.send(LivenessChange {
                    peer,
                    liveness: Liveness::Down,
                    at: now,
                });
            }
        }
    }
}

async fn ping_loop(detector: Arc<Detector>, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut shutdown = shared.shutdown_signal();
    let mut ticker = tokio::time::interval(detector.config.ping_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut peers = Vec::new();
    let mut last_round = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return,
            _ = shutdown.wait_for(|stop| *stop) => return,
            _ = ticker.tick() => {}
            _ = detector.wake.notified() => {}
        }
        let now = Instant::now();
        let late = now
            .saturating_duration_since(last_round)
            .saturating_sub(detector.config.ping_interval);
        last_round = now;
        // A round more than a whole interval late: this node was paused, not its peers.
        let paused = if late > detector.config.ping_interval {
            late
        } else {
            Duration::ZERO
        };
        detector.check(now, paused);
        peers.clear();
        peers.extend(lock(&detector.peers).keys().copied());
        // Each ping runs on its own until its deadline, so a silent peer never delays the
        // others; at most down_after / ping_interval pings per peer are in flight.
        let deadline = now + detector.config.down_after;
        for &peer in &peers {
            let detector = detector.clone();
            let shared = shared.clone();
            tokio::spawn(async move {
                if let Ok((rtt, _)) = shared.ping(peer, deadline).await {
                    detector.on_pong(peer, rtt);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector_with(peer: SocketAddr, last_pong: Instant) -> Detector {
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let state = PeerState {
            liveness: Liveness::Up,
            last_pong: Some(last_pong),
            last_rtt: None,
            watched_since: last_pong,
        };
        Detector {
            config: FailureDetectorConfig::default(),
            peers: Mutex::new(HashMap::from([(peer, state)])),
            events,
            wake: tokio::sync::Notify::new(),
        }
    }

    fn liveness(detector: &Detector, peer: SocketAddr) -> Liveness {
        lock(&detector.peers)[&peer].liveness
    }

    #[test]
    fn a_pause_of_the_detector_is_not_counted_as_the_peers_silence() {
        let peer: SocketAddr = "127.0.0.2:7000".parse().unwrap();
        let pong = Instant::now();
        let down_after = FailureDetectorConfig::default().down_after;
        // 1.5 s since the last pong, 1.2 s of it with this detector stopped: 0.3 s of silence.
        let detector = detector_with(peer, pong);
        let now = pong + down_after + Duration::from_millis(500);
        detector.check(now, Duration::from_millis(1200));
        assert_eq!(liveness(&detector, peer), Liveness::Up);
        // The same 1.5 s while the detector ran: down.
        let detector = detector_with(peer, pong);
        detector.check(now, Duration::ZERO);
        assert_eq!(liveness(&detector, peer), Liveness::Down);
        // A pause does not push the last pong into the future.
        let detector = detector_with(peer, pong);
        detector.check(pong + Duration::from_millis(100), Duration::from_secs(10));
        assert!(
            lock(&detector.peers)[&peer].last_pong.unwrap() <= pong + Duration::from_millis(100)
        );
    }
}
