//! Progress lines on stderr, written by a thread of their own.
//!
//! A `write(2)` to a file can block for tens of milliseconds, for instance while the file
//! system commits a journal transaction that a server's fsync started. Written from the
//! generator's runtime, such a wait stops the schedule: requests go out late, and both the
//! generator's lag and the latency measured from the intended send time grow because of the
//! terminal, not the server. Lines are therefore only queued during a step; a printer thread
//! writes them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender};
use std::sync::OnceLock;

/// Lines the queue holds; a line that finds it full is dropped (and counted).
const QUEUE_LINES: usize = 4096;

enum Message {
    Line(String),
    /// Answered once everything queued before it is written.
    Flush(Sender<()>),
}

static DROPPED: AtomicU64 = AtomicU64::new(0);

fn printer() -> Option<&'static SyncSender<Message>> {
    static PRINTER: OnceLock<Option<SyncSender<Message>>> = OnceLock::new();
    PRINTER
        .get_or_init(|| {
            let (tx, rx) = sync_channel::<Message>(QUEUE_LINES);
            std::thread::Builder::new()
                .name("bench-progress".into())
                .spawn(move || {
                    use std::io::Write;
                    for message in rx {
                        match message {
                            Message::Line(line) => {
                                let _ = writeln!(std::io::stderr().lock(), "{line}");
                            }
                            Message::Flush(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// Queues `line` for stderr without waiting for the write.
pub fn line(line: String) {
    match printer() {
        Some(tx) => {
            if tx.try_send(Message::Line(line)).is_err() {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
        // No thread could be started: write it here rather than lose it.
        None => eprintln!("{line}"),
    }
}

/// Waits until every line queued so far is written (between steps, where waiting costs
/// nothing), and says how many were dropped since the last call.
pub fn flush() {
    if let Some(tx) = printer() {
        let (done, written) = channel();
        if tx.send(Message::Flush(done)).is_ok() {
            let _ = written.recv();
        }
    }
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        eprintln!("({dropped} progress lines dropped: stderr did not keep up)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_lines_are_written_by_the_time_flush_returns() {
        for i in 0..10 {
            line(format!("progress test line {i}"));
        }
        flush();
        assert_eq!(DROPPED.load(Ordering::Relaxed), 0);
        // The printer is still there for the next step.
        line("progress test line after a flush".into());
        flush();
    }
}
