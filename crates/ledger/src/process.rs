//! Which process an entry of the ledger belongs to, and whether it still lives.
//!
//! A PID alone is not enough: PIDs are reused. An entry records the PID and the process's
//! start time (field 22 of `/proc/PID/stat`, clock ticks since boot), and belongs to a live
//! process only if `kill(PID, 0)` finds one and, where `/proc/PID/stat` can be read, it
//! started at that time.

use rustix::io::Errno;
use rustix::process::{test_kill_process, Pid};

/// A process, told apart from a later one given the same PID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The PID.
    pub pid: u32,
    /// Start time in clock ticks since boot; 0 when it could not be read.
    pub start: u64,
}

impl ProcessId {
    /// The calling process.
    pub fn current() -> ProcessId {
        let pid = std::process::id();
        ProcessId {
            pid,
            start: start_time(pid).unwrap_or(0),
        }
    }
}

/// The start time of `pid` from `/proc/PID/stat`, `None` when it cannot be read.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/PID/stat` line. The command name (field 2) is in parentheses and
/// may itself hold spaces and parentheses: the fields after it start after the last `)`.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts with field 3 (the state): field 22 is its 20th word.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `id` is a live process: `kill(pid, 0)` finds a process (one of another user
/// counts), and it started when `id` says (when both start times are known).
pub fn is_alive(id: ProcessId) -> bool {
    let Some(pid) = i32::try_from(id.pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    match test_kill_process(pid) {
        Ok(()) => {}
        Err(e) if e == Errno::PERM => {}
        Err(_) => return false, // ESRCH: no such process
    }
    match (id.start, start_time(id.pid)) {
        (0, _) | (_, None) => true,
        (want, Some(seen)) => want == seen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_field() {
        let line = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Some(987654));
        assert_eq!(parse_start_time("1 (x) S 1"), None);
        assert_eq!(parse_start_time(""), None);
    }

    #[test]
    fn this_process_lives_and_a_reaped_child_does_not() {
        let me = ProcessId::current();
        assert!(me.start > 0, "/proc/self/stat readable here");
        assert!(is_alive(me));
        assert!(!is_alive(ProcessId {
            start: me.start + 1,
            ..me
        }));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!is_alive(ProcessId { pid, start: 0 }));
        assert!(!is_alive(ProcessId { pid: 0, start: 0 }));
    }
}
