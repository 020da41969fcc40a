//! Stops the endpoint that is not being measured while `versus` measures the other one.
//!
//! On a machine where both servers share a core (this project's 2-core set-up: generator on
//! one, both servers on the other), the idle server's background work runs on the core the
//! measured one needs. A JVM's C2 compiler thread was seen taking every other 2 ms slice of
//! that core for seconds after Cassandra's own steps. Stopping the idle process (SIGSTOP)
//! for the length of the other's step, and continuing it (SIGCONT) after, gives each
//! server the core alone. Each side's own background work still counts against it.

/// A process stopped until this guard drops.
#[derive(Debug)]
pub struct Stopped {
    pid: Option<u32>,
}

impl Stopped {
    /// Stops `pid` (nothing for `None`). A process that cannot be stopped (gone, or not
    /// ours) is reported once on stderr and left running.
    pub fn new(pid: Option<u32>) -> Stopped {
        let pid = pid.filter(|&p| {
            let ok = signal(p, Signal::Stop);
            if !ok {
                eprintln!("warning: could not stop process {p}; it keeps running during the other endpoint's step");
            }
            ok
        });
        Stopped { pid }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(p) = self.pid {
            if !signal(p, Signal::Continue) {
                eprintln!("warning: could not continue process {p}");
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Signal {
    Stop,
    Continue,
}

#[cfg(unix)]
fn signal(pid: u32, s: Signal) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    let sig = match s {
        Signal::Stop => libc::SIGSTOP,
        Signal::Continue => libc::SIGCONT,
    };
    // SAFETY: kill only reads its two integer arguments; pid > 0 names one process.
    unsafe { libc::kill(pid, sig) == 0 }
}

#[cfg(not(unix))]
fn signal(_pid: u32, _s: Signal) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The state letter of a process (`/proc/<pid>/stat`, field 3).
    fn state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = stat.rsplit_once(')').unwrap().1;
        rest.trim_start().chars().next().unwrap()
    }

    fn wait_for(pid: u32, want: impl Fn(char) -> bool) -> char {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let s = state(pid);
            if want(s) || std::time::Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn a_process_is_stopped_while_the_guard_lives_and_continued_after() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        {
            let _stopped = Stopped::new(Some(pid));
            assert_eq!(wait_for(pid, |s| s == 'T'), 'T', "stopped");
        }
        let s = wait_for(pid, |s| s != 'T');
        assert!(s == 'S' || s == 'R', "running again, state {s}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn no_pid_or_a_gone_process_stops_nothing() {
        assert!(Stopped::new(None).pid.is_none());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(Stopped::new(Some(pid)).pid.is_none());
    }
}
