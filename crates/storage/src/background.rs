//! Storage's background threads run at a lower CPU priority than the shards.
//!
//! A memtable flush, a compaction or the freeing of a flushed memtable each take a few
//! hundred milliseconds of CPU at once. On a node with as many shards as cores they run on
//! a core a shard needs, and at equal priority the shard loses about half of it for that
//! time: its queue grows and requests time out in bursts at every flush. At nice 10 the
//! kernel gives a busy shard about ten times the CPU of a busy background thread (weights
//! 1024 to 110), and an idle core still runs background work at full speed; this plays the
//! part of ScyllaDB's scheduling groups, where compaction has fewer shares than queries.

/// Nice value of storage's background threads (the shards run at 0).
pub(crate) const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's priority to [`BACKGROUND_NICE`].
pub(crate) fn lower_current_thread() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        set_nice(tid as libc::id_t);
    }
}

/// Lowers every thread of this process whose name starts with `prefix` (fjall names its
/// workers "fjall:..."); returns how many it lowered.
pub(crate) fn lower_threads_named(prefix: &str) -> usize {
    #[cfg(target_os = "linux")]
    {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        let mut lowered = 0;
        for task in tasks.flatten() {
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            let tid = task.file_name().to_str().and_then(|t| t.parse().ok());
            if let (true, Some(tid)) = (name.starts_with(prefix), tid) {
                if set_nice(tid) {
                    lowered += 1;
                }
            }
        }
        lowered
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = prefix;
        0
    }
}

/// On Linux, PRIO_PROCESS with a thread id sets that thread's nice value alone.
#[cfg(target_os = "linux")]
fn set_nice(tid: libc::id_t) -> bool {
    // SAFETY: setpriority only reads its integer arguments; raising nice needs no privilege.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, BACKGROUND_NICE) };
    if rc != 0 {
        tracing::warn!(tid, "could not lower a storage thread's priority");
    }
    rc == 0
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn nice_of(tid: &str) -> i64 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // Field 19 is nice; fields after the ")" that ends the name start at 3.
        let rest = stat.rsplit_once(')').unwrap().1;
        rest.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn lowers_named_threads_and_the_calling_thread_only() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let named = std::thread::Builder::new()
            .name("bgtest:worker".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                tx.send(unsafe { libc::syscall(libc::SYS_gettid) }).unwrap();
                done_rx.recv().ok();
            })
            .unwrap();
        let tid = rx.recv().unwrap().to_string();
        assert_eq!(nice_of(&tid), 0);
        assert_eq!(lower_threads_named("bgtest:"), 1);
        assert_eq!(nice_of(&tid), i64::from(BACKGROUND_NICE));
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::syscall(libc::SYS_gettid) }.to_string();
        assert_eq!(nice_of(&me), 0, "other threads keep their priority");
        done_tx.send(()).unwrap();
        named.join().unwrap();

        let other = std::thread::spawn(|| {
            lower_current_thread();
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) }.to_string();
            nice_of(&tid)
        });
        assert_eq!(other.join().unwrap(), i64::from(BACKGROUND_NICE));
    }
}
