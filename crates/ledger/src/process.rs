//! Which process an entry of the node ledger belongs to, and whether it still counts.
//!
//! A PID alone is not enough: PIDs are reused, and anyone can write a PID into a file. An
//! entry names the PID and the process's start time (field 22 of `/proc/PID/stat`, clock
//! ticks since boot), and counts only if ([`verdict`]):
//!
//! - a process with that PID exists and started at exactly that time (a start time of 0 is
//!   never taken: it is what a forger who does not know the real one writes);
//! - it is not a zombie (killed but not yet reaped: its memory is gone);
//! - the entry's file is owned by the process's real or effective user: a user cannot
//!   write an entry that counts for another user's process.
//!
//! Where `/proc/PID` cannot be read although the process exists (`/proc` mounted with
//! `hidepid`), the entry cannot be checked and counts, to be safe ([`Verdict::Hidden`]).

use rustix::io::Errno;
use rustix::process::{test_kill_process, Pid};

/// A process, told apart from a later one given the same PID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId {
    /// The PID.
    pub pid: u32,
    /// Start time in clock ticks since boot (never 0 for a process that can be checked).
    pub start: u64,
}

impl ProcessId {
    /// The calling process; its start time 0 when `/proc/self/stat` cannot be read.
    pub fn current() -> ProcessId {
        Self::current_checked().unwrap_or(ProcessId {
            pid: std::process::id(),
            start: 0,
        })
    }

    /// The calling process, or why its start time cannot be read (without it, no entry of
    /// it can be told from a later process's, so it cannot join a ledger).
    pub fn current_checked() -> Result<ProcessId, String> {
        let pid = std::process::id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_err(|e| format!("reading /proc/{pid}/stat: {e} (is /proc mounted?)"))?;
        match parse_stat(&stat) {
            Some((_, start)) if start > 0 => Ok(ProcessId { pid, start }),
            _ => Err(format!(
                "/proc/{pid}/stat has no start time (field 22) above 0: {:?}",
                stat.trim()
            )),
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
    parse_stat(stat).map(|(_, start)| start)
}

/// The state (field 3) and start time (field 22) of a `/proc/PID/stat` line.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut words = rest.split_whitespace();
    let state = words.next()?.chars().next()?;
    // `rest` starts with field 3 (the state): field 22 is its 20th word.
    let start = words.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// The real and effective uid from a `/proc/PID/status` text.
fn parse_uids(status: &str) -> Option<(u32, u32)> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut ids = line.split_whitespace().map(|w| w.parse::<u32>().ok());
    Some((ids.next()??, ids.next()??))
}

/// What an entry's process is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Alive, started when the entry says, owned by the entry's writer: the entry counts.
    Live,
    /// No such process, or the PID now belongs to one started at another time (or the
    /// entry's start time is 0): the entry does not count, and may be removed.
    Gone,
    /// Killed, not yet reaped: its memory is gone; the entry does not count.
    Zombie,
    /// The process belongs to another user than the entry's writer: the entry does not
    /// count (a forgery, or a PID reused by another user's process).
    Foreign {
        /// The process's effective uid.
        owner: u32,
        /// The uid that owns the entry's file.
        writer: u32,
    },
    /// The process exists but `/proc` does not show it (`hidepid`): the entry counts, as
    /// nothing proves it false.
    Hidden,
}

impl Verdict {
    /// Whether an entry with this verdict counts in the ledger.
    pub fn counts(self) -> bool {
        matches!(self, Verdict::Live | Verdict::Hidden)
    }
}

/// Whether a process with this PID exists (`kill(PID, 0)`; one of another user counts).
fn exists(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    match test_kill_process(pid) {
        Ok(()) => true,
        Err(e) => e == Errno::PERM,
    }
}

/// What `id` is now, for an entry whose file `writer` owns.
pub fn verdict(id: ProcessId, writer: u32) -> Verdict {
    if id.pid == 0 || id.start == 0 || i32::try_from(id.pid).is_err() {
        return Verdict::Gone;
    }
    let stat = match std::fs::read_to_string(format!("/proc/{}/stat", id.pid)) {
        Ok(s) => s,
        Err(_) if exists(id.pid) => return Verdict::Hidden,
        Err(_) => return Verdict::Gone,
    };
    let Some((state, start)) = parse_stat(&stat) else {
        return Verdict::Hidden;
    };
    if start != id.start {
        return Verdict::Gone;
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", id.pid)).ok();
    // A process whose main thread has exited shows as a zombie while its other threads
    // still run (and hold memory): only one with no thread left is gone.
    if matches!(state, 'Z' | 'X' | 'x') && threads(status.as_deref()).is_none_or(|n| n <= 1) {
        return Verdict::Zombie;
    }
    let Some((real, effective)) = status.as_deref().and_then(parse_uids) else {
        return Verdict::Hidden;
    };
    if writer != real && writer != effective {
        return Verdict::Foreign {
            owner: effective,
            writer,
        };
    }
    Verdict::Live
}

/// The `Threads:` count of a `/proc/PID/status` text.
fn threads(status: Option<&str>) -> Option<u64> {
    status?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn my_uid() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    /// Kills and reaps the child when dropped, whatever happened.
    struct Reaped(std::process::Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn stat_fields() {
        let line = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Some(987654));
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        assert_eq!(parse_start_time("1 (x) S 1"), None);
        assert_eq!(parse_start_time(""), None);
        let status = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t1\t1\t1\t1\n";
        assert_eq!(parse_uids(status), Some((1000, 1001)));
        assert_eq!(parse_uids("Name:\tx\n"), None);
    }

    #[test]
    fn this_process_counts_and_reaped_reused_or_forged_ones_do_not() {
        let me = ProcessId::current_checked().unwrap();
        assert!(me.start > 0);
        assert_eq!(verdict(me, my_uid()), Verdict::Live);
        // Another start time: the PID reused.
        assert_eq!(
            verdict(
                ProcessId {
                    start: me.start + 1,
                    ..me
                },
                my_uid()
            ),
            Verdict::Gone
        );
        // PID 1 with start time 0: a forgery that counted for ever before.
        assert_eq!(verdict(ProcessId { pid: 1, start: 0 }, 0), Verdict::Gone);
        // PID 1 with its real start time, written by someone who is not its user.
        if let Some(start) = start_time(1) {
            let v = verdict(ProcessId { pid: 1, start }, 65534);
            assert!(
                matches!(v, Verdict::Foreign { writer: 65534, .. }),
                "PID 1 written by 65534: {v:?}"
            );
        }
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = start_time(pid).unwrap_or(1);
        child.wait().unwrap();
        assert_eq!(verdict(ProcessId { pid, start }, my_uid()), Verdict::Gone);
        assert_eq!(verdict(ProcessId { pid: 0, start: 1 }, 0), Verdict::Gone);
    }

    #[test]
    fn a_killed_unreaped_process_is_a_zombie_and_does_not_count() {
        let child = Reaped(
            std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        let id = ProcessId {
            pid,
            start: start_time(pid).unwrap(),
        };
        assert_eq!(verdict(id, my_uid()), Verdict::Live);
        // SIGKILL, not reaped: a zombie once the kernel has finished it.
        rustix::process::kill_process(
            Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        // A bounded wait for the kernel to finish the kill (an event, not a timing).
        let mut v = verdict(id, my_uid());
        for _ in 0..2000 {
            if v != Verdict::Live {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            v = verdict(id, my_uid());
        }
        assert_eq!(v, Verdict::Zombie);
        assert!(!v.counts());
        drop(child);
        assert_eq!(verdict(id, my_uid()), Verdict::Gone);
    }
}
