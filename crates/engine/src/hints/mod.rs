//! Hints on disk: the MUTATION bodies a coordinator keeps for replicas that are down, in one
//! append-only file at a time per target host under the node's `hints` directory, so that a
//! restart of the coordinator does not lose them.
//!
//! A shard only queues a hint in memory ([`HintStore::store`]); one thread, `sluice-hints`,
//! owns every file: it appends the queue in batches (every [`HintConfig::flush_interval`], each
//! batch written and fdatasync'd), reads files back for replay, and deletes them. A kill -9
//! loses at most the hints queued since the last batch; a power failure also the batch being
//! synced. Replay takes a host's oldest file, sealing the file being appended if it is the
//! only one, and deletes it once every record in it was delivered or had expired.

pub mod format;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use uuid::Uuid;

use format::{End, Next};

/// Most bytes of hints a node holds for all its peers together (on disk and queued); past it
/// the oldest files are removed, and a hint that still does not fit is dropped (counted),
/// never the foreground write.
pub const MAX_HINT_BYTES: u64 = 64 << 20;
/// A host's file is sealed and a new one started once it reaches this size, so that the byte
/// bound removes a sixteenth of it at a time.
pub const MAX_HINT_FILE_BYTES: u64 = MAX_HINT_BYTES / 16;
/// How long a hint is kept: older ones are skipped at replay and removed (Cassandra's
/// `max_hint_window`).
pub const HINT_WINDOW: Duration = Duration::from_secs(3 * 3600);
/// How often queued hints are written and synced: the most a kill -9 loses.
pub const HINT_FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// Queued bytes that start a batch before the interval ends.
const FLUSH_EARLY_BYTES: u64 = 1 << 20;
/// How often files past the window are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// The most record bytes one replay batch carries (at least one record).
const REPLAY_BATCH_BYTES: u64 = 256 << 10;
const HEADER_BYTES: u64 = format::FILE_MAGIC.len() as u64;

/// Where and within which bounds hints are kept.
#[derive(Debug, Clone)]
pub struct HintConfig {
    /// The directory of the hint files (created if missing).
    pub dir: PathBuf,
    /// Most bytes on disk and queued, for all hosts.
    pub max_bytes: u64,
    /// Size at which a host's file is sealed.
    pub max_file_bytes: u64,
    /// Age past which a hint is not replayed.
    pub window: Duration,
    /// Interval between written batches.
    pub flush_interval: Duration,
}

impl HintConfig {
    /// The default bounds, with files in `dir`.
    pub fn new(dir: PathBuf) -> HintConfig {
        HintConfig {
            dir,
            max_bytes: MAX_HINT_BYTES,
            max_file_bytes: MAX_HINT_FILE_BYTES,
            window: HINT_WINDOW,
            flush_interval: HINT_FLUSH_INTERVAL,
        }
    }
}

/// What the hint store holds and has done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HintStats {
    /// Hints held (queued or on disk, not yet replayed).
    pub held: usize,
    /// Their bytes: queued records plus the hint files.
    pub bytes: usize,
    /// Bytes of the hint files on disk.
    pub disk_bytes: usize,
    /// Hints stored since start.
    pub stored: u64,
    /// Hints dropped: over the byte bound, older than the window, unreadable, or not written.
    pub dropped: u64,
    /// Hints delivered to their replica since start.
    pub replayed: u64,
}

/// Milliseconds since the Unix epoch: hint ages must survive a restart, which `Instant`s do
/// not.
fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One hint file as the store accounts for it.
#[derive(Debug, Clone)]
struct FileMeta {
    host: Uuid,
    /// The file's length.
    bytes: u64,
    /// Records neither delivered nor dropped yet.
    records: u64,
    /// The newest record's creation (Unix milliseconds).
    newest_ms: u64,
    /// No more appends; only sealed files are replayed or removed for the bound.
    sealed: bool,
    /// A replay batch of it is out.
    replaying: bool,
    /// Where the next replay batch starts (records before it were delivered or dropped).
    resume: u64,
}

/// A replay batch's outcome, applied by the writer thread.
#[derive(Debug)]
struct Delivered {
    seq: u64,
    /// Records before this offset are done with.
    upto: u64,
    delivered: u64,
    expired: u64,
    /// The file has nothing left: delete it.
    complete: bool,
}

enum Command {
    NextBatch {
        host: Uuid,
        reply: tokio::sync::oneshot::Sender<Option<HintBatch>>,
    },
    Delivered(Delivered),
}

#[derive(Default)]
struct State {
    /// Hints not yet written: (host, created, body).
    queued: Vec<(Uuid, u64, Bytes)>,
    queued_bytes: u64,
    disk_bytes: u64,
    /// Every hint file by sequence number (oldest first).
    files: BTreeMap<u64, FileMeta>,
    commands: Vec<Command>,
    /// Files to delete (sequence, host), no longer in `files`.
    doomed: Vec<(u64, Uuid)>,
    stats: HintStats,
    flush_requested: u64,
    flushed: u64,
    stopping: bool,
}

impl State {
    fn sync_stats(&mut self) {
        self.stats.bytes = (self.queued_bytes + self.disk_bytes) as usize;
        self.stats.disk_bytes = self.disk_bytes as usize;
    }

    /// Forgets file `seq`, counting its remaining records as dropped, and queues its deletion.
    fn drop_file(&mut self, seq: u64) {
        if let Some(meta) = self.files.remove(&seq) {
            debug_assert!(self.disk_bytes >= meta.bytes);
            self.disk_bytes -= meta.bytes;
            self.stats.held -= meta.records as usize;
            self.stats.dropped += meta.records;
            self.doomed.push((seq, meta.host));
            self.sync_stats();
        }
    }

    /// Removes the oldest sealed file not being replayed; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        let oldest = self
            .files
            .iter()
            .find(|(_, m)| m.sealed && !m.replaying)
            .map(|(seq, _)| *seq);
        match oldest {
            Some(seq) => {
                self.drop_file(seq);
                true
            }
            None => false,
        }
    }
}

struct Shared {
    config: HintConfig,
    state: Mutex<State>,
    /// The writer waits on it.
    wake: Condvar,
    /// Flush callers wait on it.
    flushed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Hints for replicas that are down, kept on disk per host, bounded in bytes and age.
pub struct HintStore {
    shared: Arc<Shared>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for HintStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HintStore")
            .field("dir", &self.shared.config.dir)
            .finish()
    }
}

/// Records of one hint file, read for replay to one host.
#[derive(Debug)]
pub struct HintBatch {
    host: Uuid,
    seq: u64,
    start: u64,
    /// Each record's body and the offset just past it.
    records: Vec<(Bytes, u64)>,
    /// End offsets of records skipped as older than the window.
    expired: Vec<u64>,
    /// Offset past the last record read.
    read_to: u64,
    /// The file ends in this batch.
    last: bool,
}

impl HintBatch {
    /// The host these hints are for.
    pub fn host(&self) -> Uuid {
        self.host
    }

    /// The MUTATION bodies to send, oldest first.
    pub fn bodies(&self) -> impl ExactSizeIterator<Item = &Bytes> {
        self.records.iter().map(|(b, _)| b)
    }

    /// How many hints the batch carries.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether it carries none (every record read had expired, or the file had none left).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn outcome(&self, delivered: usize) -> Delivered {
        debug_assert!(delivered <= self.records.len());
        let all = delivered == self.records.len();
        let upto = if all {
            self.read_to
        } else if delivered == 0 {
            self.start
        } else {
            self.records[delivered - 1].1
        };
        Delivered {
            seq: self.seq,
            upto,
            delivered: delivered as u64,
            expired: self.expired.iter().filter(|&&end| end <= upto).count() as u64,
            complete: all && self.last,
        }
    }
}

impl HintStore {
    /// Opens the store on `config.dir`: finds the files a previous run left (sealed, replayed
    /// like new ones), drops those past the window or over the bound, and starts the writer.
    pub fn open(config: HintConfig) -> std::io::Result<HintStore> {
        std::fs::create_dir_all(&config.dir)?;
        let now_ms = unix_millis();
        let mut state = State::default();
        let mut last_seq = 0;
        for entry in std::fs::read_dir(&config.dir)? {
            let entry = entry?;
            let Some((host, seq)) = entry.file_name().to_str().and_then(format::parse_file_name)
            else {
                continue;
            };
            last_seq = last_seq.max(seq);
            let path = entry.path();
            let scanned = scan_file(&path);
            match scanned {
                Ok(Some((records, newest_ms, bytes))) if records > 0 => {
                    state.files.insert(
                        seq,
                        FileMeta {
                            host,
                            bytes,
                            records,
                            newest_ms,
                            sealed: true,
                            replaying: false,
                            resume: HEADER_BYTES,
                        },
                    );
                    state.disk_bytes += bytes;
                    state.stats.held += records as usize;
                }
                Ok(_) => {
                    // No whole record: nothing to replay.
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "hint file unreadable; removed");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        state.sync_stats();
        expire(&mut state, now_ms, config.window);
        while state.disk_bytes > config.max_bytes && state.evict_oldest() {}
        for (seq, host) in std::mem::take(&mut state.doomed) {
            let _ = std::fs::remove_file(config.dir.join(format::file_name(host, seq)));
        }
        if !state.files.is_empty() {
            tracing::info!(
                files = state.files.len(),
                hints = state.stats.held,
                bytes = state.disk_bytes,
                "hints found on disk"
            );
        }
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(state),
            wake: Condvar::new(),
            flushed: Condvar::new(),
        });
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("sluice-hints".into())
                .spawn(move || Writer::new(shared, last_seq + 1).run())?
        };
        Ok(HintStore {
            shared,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Queues `body` for `host`, created now; false (counted as dropped) when it does not fit
    /// in the byte bound even after removing older files, or the store is closed.
    pub fn store(&self, host: Uuid, body: Bytes) -> bool {
        self.store_at(host, body, unix_millis())
    }

    /// [`HintStore::store`] with the creation time given (Unix milliseconds).
    pub fn store_at(&self, host: Uuid, body: Bytes, created_ms: u64) -> bool {
        let size = format::record_bytes(body.len());
        let max = self.shared.config.max_bytes;
        let mut s = self.shared.lock();
        if s.stopping || body.len() > format::MAX_RECORD_BODY {
            s.stats.dropped += 1;
            return false;
        }
        while s.queued_bytes + s.disk_bytes + size > max {
            if !s.evict_oldest() {
                s.stats.dropped += 1;
                return false;
            }
        }
        s.queued.push((host, created_ms, body));
        s.queued_bytes += size;
        s.stats.held += 1;
        s.stats.stored += 1;
        s.sync_stats();
        debug_assert!(s.queued_bytes + s.disk_bytes <= max);
        if s.queued_bytes >= FLUSH_EARLY_BYTES {
            self.shared.wake.notify_one();
        }
        true
    }

    /// Hosts with hints on disk.
    pub fn hosts(&self) -> Vec<Uuid> {
        let s = self.shared.lock();
        let mut hosts: Vec<Uuid> = Vec::new();
        for meta in s.files.values() {
            if !hosts.contains(&meta.host) {
                hosts.push(meta.host);
            }
        }
        hosts
    }

    /// The next records to replay to `host`, from its oldest file (written hints only; call
    /// [`HintStore::delivered`] with the outcome before asking again). None when it has none.
    pub async fn next_batch(&self, host: Uuid) -> Option<HintBatch> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        {
            let mut s = self.shared.lock();
            if s.stopping {
                return None;
            }
            s.commands.push(Command::NextBatch { host, reply });
        }
        self.shared.wake.notify_one();
        answer.await.ok().flatten()
    }

    /// Reports that the first `delivered` hints of `batch` reached their replica; the rest
    /// are sent again by the next batch. A file whose every record is done is deleted.
    pub fn delivered(&self, batch: &HintBatch, delivered: usize) {
        let outcome = batch.outcome(delivered);
        {
            let mut s = self.shared.lock();
            s.commands.push(Command::Delivered(outcome));
        }
        self.shared.wake.notify_one();
    }

    /// Writes and syncs every hint queued before the call; blocks until done.
    pub fn flush(&self) {
        let mut s = self.shared.lock();
        if s.stopping {
            return;
        }
        s.flush_requested += 1;
        let target = s.flush_requested;
        self.shared.wake.notify_one();
        while s.flushed < target && !s.stopping {
            s = self
                .shared
                .flushed
                .wait(s)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Writes what is queued, syncs, and stops the writer; later hints are dropped.
    pub fn close(&self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_one();
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(writer) = writer {
            if writer.join().is_err() {
                tracing::error!("the hint writer panicked");
            }
        }
        self.shared.flushed.notify_all();
    }

    /// What the store holds and has done.
    pub fn stats(&self) -> HintStats {
        self.shared.lock().stats
    }
}

impl Drop for HintStore {
    fn drop(&mut self) {
        self.close();
    }
}

/// Counts the whole records of a file left by an earlier run: (records, newest creation,
/// file length); None when the header is not a hint file's.
fn scan_file(path: &Path) -> std::io::Result<Option<(u64, u64, u64)>> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut r = BufReader::new(file);
    if !format::read_header(&mut r)? {
        return Ok(None);
    }
    let (mut records, mut newest) = (0, 0);
    loop {
        match format::read_record(&mut r)? {
            Next::Record(rec) => {
                records += 1;
                newest = newest.max(rec.created_ms);
            }
            Next::End(End::Clean) => break,
            Next::End(end) => {
                // A crash mid-write: the records before it are replayed, the rest dropped.
                tracing::warn!(file = %path.display(), ?end, records, "hint file ends early");
                break;
            }
        }
    }
    Ok(Some((records, newest, len)))
}

/// Drops every file whose newest record is older than the window, unless a batch of it is
/// out (that batch's records are skipped as expired).
fn expire(state: &mut State, now_ms: u64, window: Duration) {
    let window_ms = window.as_millis() as u64;
    let old: Vec<u64> = state
        .files
        .iter()
        .filter(|(_, m)| m.sealed && !m.replaying && now_ms.saturating_sub(m.newest_ms) > window_ms)
        .map(|(seq, _)| *seq)
        .collect();
    for seq in old {
        state.drop_file(seq);
    }
}

/// A host's file being appended.
struct OpenFile {
    seq: u64,
    file: File,
    len: u64,
}

/// The `sluice-hints` thread: the only code that touches hint files once the store is open.
struct Writer {
    shared: Arc<Shared>,
    next_seq: u64,
    open: HashMap<Uuid, OpenFile>,
    last_sweep: Instant,
}

impl Writer {
    fn new(shared: Arc<Shared>, next_seq: u64) -> Writer {
        Writer {
            shared,
            next_seq,
            open: HashMap::new(),
            last_sweep: Instant::now(),
        }
    }

    fn path(&self, host: Uuid, seq: u64) -> PathBuf {
        self.shared.config.dir.join(format::file_name(host, seq))
    }

    fn run(mut self) {
        let interval = self.shared.config.flush_interval;
        // Batches start on a fixed cadence, so that the time a batch takes to write and sync
        // does not stretch the interval a kill can lose.
        let mut until = Instant::now() + interval;
        loop {
            let (queued, commands, doomed, flush_to, stopping) = {
                let mut s = self.shared.lock();
                while s.queued_bytes < FLUSH_EARLY_BYTES
                    && s.commands.is_empty()
                    && s.doomed.is_empty()
                    && s.flush_requested == s.flushed
                    && !s.stopping
                {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    s = self
                        .shared
                        .wake
                        .wait_timeout(s, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                let now = Instant::now();
                if now >= until {
                    until = (until + interval).max(now);
                }
                (
                    std::mem::take(&mut s.queued),
                    std::mem::take(&mut s.commands),
                    std::mem::take(&mut s.doomed),
                    s.flush_requested,
                    s.stopping,
                )
            };
            if !queued.is_empty() {
                self.write(queued);
            }
            for (seq, host) in doomed {
                self.remove(host, seq);
            }
            for command in commands {
                match command {
                    Command::NextBatch { host, reply } => {
                        let batch = self.next_batch(host);
                        if let Err(Some(batch)) = reply.send(batch) {
                            // The replay went away: its file is free again.
                            self.apply(batch.outcome(0));
                        }
                    }
                    Command::Delivered(d) => self.apply(d),
                }
            }
            if self.last_sweep.elapsed() >= SWEEP_INTERVAL || stopping {
                self.last_sweep = Instant::now();
                self.sweep();
            }
            {
                let mut s = self.shared.lock();
                s.flushed = s.flushed.max(flush_to);
            }
            self.shared.flushed.notify_all();
            if stopping {
                // Stores are refused from the moment `stopping` was read with the queue.
                return;
            }
        }
    }

    /// Appends the queued hints to their hosts' files, syncs every file written, and only
    /// then accounts them as on disk.
    fn write(&mut self, queued: Vec<(Uuid, u64, Bytes)>) {
        let max_file = self.shared.config.max_file_bytes;
        let taken_bytes: u64 = queued
            .iter()
            .map(|(_, _, body)| format::record_bytes(body.len()))
            .sum();
        let mut groups: Vec<(Uuid, Vec<(u64, Bytes)>)> = Vec::new();
        for (host, at, body) in queued {
            match groups.iter_mut().find(|(h, _)| *h == host) {
                Some((_, records)) => records.push((at, body)),
                None => groups.push((host, vec![(at, body)])),
            }
        }
        // (seq, host, bytes added, records added, newest, sealed now); files to sync.
        let mut written: Vec<(u64, Uuid, u64, u64, u64, bool)> = Vec::new();
        let mut to_sync: Vec<File> = Vec::new();
        let mut failed_records = 0u64;
        let mut created = false;
        for (host, records) in groups {
            let mut i = 0;
            while i < records.len() {
                if !self.open.contains_key(&host) {
                    match self.create(host) {
                        Ok(f) => {
                            created = true;
                            written.push((f.seq, host, HEADER_BYTES, 0, 0, false));
                            self.open.insert(host, f);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, %host, "cannot create a hint file; hints dropped");
                            failed_records += (records.len() - i) as u64;
                            break;
                        }
                    }
                }
                let f = self.open.get_mut(&host).expect("opened above");
                let mut buf = Vec::new();
                let (mut count, mut newest) = (0u64, 0u64);
                while i < records.len() {
                    let (at, body) = &records[i];
                    let size = format::record_bytes(body.len());
                    if f.len + buf.len() as u64 + size > max_file
                        && (f.len > HEADER_BYTES || !buf.is_empty())
                    {
                        break;
                    }
                    format::encode_record(&mut buf, *at, body);
                    count += 1;
                    newest = newest.max(*at);
                    i += 1;
                }
                let seal = i < records.len() || f.len + buf.len() as u64 >= max_file;
                if !buf.is_empty() {
                    if let Err(e) = f.file.write_all(&buf) {
                        tracing::warn!(error = %e, %host, "cannot write hints; dropped");
                        // Later appends must not follow a torn record: cut it and seal.
                        let _ = f.file.set_len(f.len);
                        failed_records += count;
                        let seq = f.seq;
                        written.push((seq, host, 0, 0, 0, true));
                        if let Some(f) = self.open.remove(&host) {
                            to_sync.push(f.file);
                        }
                        continue;
                    }
                    f.len += buf.len() as u64;
                }
                written.push((f.seq, host, buf.len() as u64, count, newest, seal));
                let synced = f.file.try_clone();
                if seal {
                    if let Some(f) = self.open.remove(&host) {
                        to_sync.push(f.file);
                    }
                } else if let Ok(file) = synced {
                    to_sync.push(file);
                }
            }
        }
        for file in &to_sync {
            if let Err(e) = file.sync_data() {
                tracing::warn!(error = %e, "cannot sync a hint file");
            }
        }
        if created {
            self.sync_dir();
        }
        let mut s = self.shared.lock();
        for (seq, host, bytes, records, newest, sealed) in written {
            let meta = s.files.entry(seq).or_insert(FileMeta {
                host,
                bytes: 0,
                records: 0,
                newest_ms: 0,
                sealed: false,
                replaying: false,
                resume: HEADER_BYTES,
            });
            meta.bytes += bytes;
            meta.records += records;
            meta.newest_ms = meta.newest_ms.max(newest);
            meta.sealed |= sealed;
            s.disk_bytes += bytes;
        }
        // Every record taken from the queue is now on disk or dropped.
        debug_assert!(s.queued_bytes >= taken_bytes);
        s.queued_bytes -= taken_bytes.min(s.queued_bytes);
        s.stats.held -= failed_records as usize;
        s.stats.dropped += failed_records;
        s.sync_stats();
    }

    fn create(&mut self, host: Uuid) -> std::io::Result<OpenFile> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(self.path(host, seq))?;
        file.write_all(&format::FILE_MAGIC)?;
        Ok(OpenFile {
            seq,
            file,
            len: HEADER_BYTES,
        })
    }

    /// Makes new files' names durable.
    fn sync_dir(&self) {
        if let Ok(dir) = File::open(&self.shared.config.dir) {
            let _ = dir.sync_all();
        }
    }

    fn remove(&mut self, host: Uuid, seq: u64) {
        if self.open.get(&host).is_some_and(|f| f.seq == seq) {
            self.open.remove(&host);
        }
        if let Err(e) = std::fs::remove_file(self.path(host, seq)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(error = %e, %host, seq, "cannot remove a hint file");
            }
        }
    }

    /// Seals `host`'s file being appended (the hints queued so far are in it already).
    fn seal(&mut self, host: Uuid) {
        if let Some(f) = self.open.remove(&host) {
            if let Some(meta) = self.shared.lock().files.get_mut(&f.seq) {
                meta.sealed = true;
            }
        }
    }

    fn next_batch(&mut self, host: Uuid) -> Option<HintBatch> {
        // The host's oldest sealed file, unless a batch of it is out: one replay at a time,
        // in order.
        let oldest = |s: &State| {
            s.files
                .iter()
                .find(|(_, m)| m.host == host && m.sealed)
                .map(|(seq, m)| (*seq, m.resume, m.replaying))
        };
        let mut found = oldest(&self.shared.lock());
        if found.is_none() {
            self.seal(host);
            found = oldest(&self.shared.lock());
        }
        let (seq, resume, out) = found?;
        if out {
            return None;
        }
        self.shared
            .lock()
            .files
            .get_mut(&seq)
            .expect("found above")
            .replaying = true;
        let window_ms = self.shared.config.window.as_millis() as u64;
        let now_ms = unix_millis();
        let mut batch = HintBatch {
            host,
            seq,
            start: resume,
            records: Vec::new(),
            expired: Vec::new(),
            read_to: resume,
            last: false,
        };
        let read = (|| -> std::io::Result<()> {
            let mut file = File::open(self.path(host, seq))?;
            file.seek(SeekFrom::Start(resume))?;
            let mut r = BufReader::new(file);
            let mut bytes = 0;
            while bytes < REPLAY_BATCH_BYTES {
                match format::read_record(&mut r)? {
                    Next::Record(rec) => {
                        let size = format::record_bytes(rec.body.len());
                        batch.read_to += size;
                        bytes += size;
                        if now_ms.saturating_sub(rec.created_ms) > window_ms {
                            batch.expired.push(batch.read_to);
                        } else {
                            batch.records.push((rec.body, batch.read_to));
                        }
                    }
                    Next::End(end) => {
                        if end != End::Clean {
                            tracing::warn!(%host, seq, ?end, "hint file ends early; the rest is dropped");
                        }
                        batch.last = true;
                        break;
                    }
                }
            }
            Ok(())
        })();
        if let Err(e) = read {
            // An unreadable file is given up, never retried forever.
            tracing::warn!(error = %e, %host, seq, "cannot read a hint file; its hints are dropped");
            batch.last = true;
        }
        Some(batch)
    }

    fn apply(&mut self, d: Delivered) {
        let mut s = self.shared.lock();
        let Some(meta) = s.files.get_mut(&d.seq) else {
            return;
        };
        debug_assert!(meta.replaying, "a batch of file {} was out", d.seq);
        meta.replaying = false;
        meta.resume = meta.resume.max(d.upto);
        let done = (d.delivered + d.expired).min(meta.records);
        meta.records -= done;
        s.stats.held -= done as usize;
        s.stats.replayed += d.delivered;
        s.stats.dropped += d.expired;
        if d.complete {
            // Whatever the count still holds was past a torn or corrupt record.
            s.drop_file(d.seq);
            let doomed = std::mem::take(&mut s.doomed);
            drop(s);
            for (seq, host) in doomed {
                self.remove(host, seq);
            }
        }
    }

    /// Seals files past the window (so that they can go) and drops them.
    fn sweep(&mut self) {
        let window_ms = self.shared.config.window.as_millis() as u64;
        let now_ms = unix_millis();
        let stale: Vec<Uuid> = {
            let s = self.shared.lock();
            self.open
                .iter()
                .filter(|(_, f)| {
                    s.files
                        .get(&f.seq)
                        .is_some_and(|m| now_ms.saturating_sub(m.newest_ms) > window_ms)
                })
                .map(|(h, _)| *h)
                .collect()
        };
        for host in stale {
            self.seal(host);
        }
        let doomed = {
            let mut s = self.shared.lock();
            expire(&mut s, now_ms, self.shared.config.window);
            std::mem::take(&mut s.doomed)
        };
        for (seq, host) in doomed {
            self.remove(host, seq);
        }
    }
}

#[cfg(test)]
mod tests;
