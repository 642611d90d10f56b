//! Random joins, leaves, observations, waiting allocations, configuration changes and action
//! outcomes never make the scheduler release a job while another job's process may run,
//! give a second action for a process whose last one is outstanding, or panic.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use cudaw_sched::{Action, Config, Observation, Outcome, Pid, Scheduler};
use proptest::prelude::*;

const GIB: u64 = 1 << 30;

#[derive(Debug, Clone)]
enum Op {
    Join {
        pid: Pid,
        job: u8,
    },
    Leave {
        pid: Pid,
    },
    Observe {
        pid: Pid,
        waiting: bool,
        resident: u8,
        swapped: u8,
    },
    AllocWait {
        pid: Pid,
        gib: u8,
    },
    Advance {
        ms: u16,
    },
    /// The oldest outstanding action ends.
    Complete {
        ok: bool,
    },
    /// A done for an action that is not outstanding (late, or for a process that left).
    Stale {
        pid: Pid,
        kind: u8,
        ok: bool,
    },
    Reconfigure {
        which: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let pid = 1u32..7;
    prop_oneof![
        2 => (pid.clone(), 0u8..4).prop_map(|(pid, job)| Op::Join { pid, job }),
        1 => pid.clone().prop_map(|pid| Op::Leave { pid }),
        4 => (pid.clone(), any::<bool>(), 0u8..60, 0u8..60).prop_map(
            |(pid, waiting, resident, swapped)| Op::Observe { pid, waiting, resident, swapped }
        ),
        1 => (pid.clone(), 0u8..50).prop_map(|(pid, gib)| Op::AllocWait { pid, gib }),
        4 => (0u16..400).prop_map(|ms| Op::Advance { ms }),
        6 => any::<bool>().prop_map(|ok| Op::Complete { ok }),
        1 => (pid, 0u8..4, any::<bool>()).prop_map(|(pid, kind, ok)| Op::Stale { pid, kind, ok }),
        1 => (0u8..3).prop_map(|which| Op::Reconfigure { which }),
    ]
}

fn configs() -> Vec<Config> {
    let texts = [
        "",
        r#"
        quantum = "20ms"
        min_quantum = "5ms"
        [[job]]
        id = "j0"
        request = 0.3
        limit = 0.4
        priority = 5
        [[job]]
        id = "j1"
        request = 0.7
        memory = "40G"
        "#,
        r#"
        [default]
        limit = 0.5
        [[job]]
        id = "j2"
        priority = -3
        limit = 0.1
        "#,
    ];
    texts
        .iter()
        .map(|t| Config::parse(t).expect("valid"))
        .collect()
}

/// What the daemon knows of one process.
struct Known {
    job: String,
    /// Its gate may be open.
    open: bool,
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let configs = configs();
    let t0 = Instant::now();
    let mut now = t0;
    let mut s = Scheduler::new(80 * GIB, &configs[0]);
    let mut known: BTreeMap<Pid, Known> = BTreeMap::new();
    let mut outstanding: VecDeque<Action> = VecDeque::new();

    for op in ops {
        match op {
            Op::Join { pid, job } => {
                let job = format!("j{job}");
                match known.get(&pid) {
                    Some(k) if k.job == job => {}
                    _ => {
                        outstanding.retain(|a| a.pid() != pid);
                        known.insert(
                            pid,
                            Known {
                                job: job.clone(),
                                open: true,
                            },
                        );
                    }
                }
                s.join(pid, &job, now);
            }
            Op::Leave { pid } => {
                known.remove(&pid);
                outstanding.retain(|a| a.pid() != pid);
                s.leave(pid, now);
            }
            Op::Observe {
                pid,
                waiting,
                resident,
                swapped,
            } => {
                let seen = Observation {
                    waiting,
                    resident: u64::from(resident) * GIB,
                    swapped: u64::from(swapped) * GIB,
                    launches: 0,
                    host_kept: 0,
                };
                s.observe(pid, seen, now);
            }
            Op::AllocWait { pid, gib } => s.alloc_wait(pid, u64::from(gib) * GIB, now),
            Op::Advance { ms } => now += Duration::from_millis(u64::from(ms)),
            Op::Complete { ok } => {
                if let Some(a) = outstanding.pop_front() {
                    let pid = a.pid();
                    if let Some(k) = known.get_mut(&pid) {
                        match a {
                            Action::Hold(_) if ok => k.open = false,
                            Action::Hold(_) | Action::Release(_) => k.open = true,
                            _ => {}
                        }
                    }
                    let outcome = if ok {
                        Outcome::Done
                    } else {
                        Outcome::Failed("no answer".into())
                    };
                    s.done(&a, outcome, now);
                }
            }
            Op::Stale { pid, kind, ok } => {
                let a = match kind {
                    0 => Action::Hold(pid),
                    1 => Action::Release(pid),
                    2 => Action::SwapOut(pid),
                    _ => Action::SwapIn(pid),
                };
                if !outstanding.contains(&a) {
                    let outcome = if ok {
                        Outcome::Done
                    } else {
                        Outcome::Failed("late".into())
                    };
                    s.done(&a, outcome, now);
                }
            }
            Op::Reconfigure { which } => s.set_config(&configs[usize::from(which)], now),
        }

        for a in s.tick(now) {
            let pid = a.pid();
            let Some(k) = known.get(&pid) else {
                return Err(TestCaseError::fail(format!(
                    "{a:?} for a process not joined"
                )));
            };
            prop_assert!(
                !outstanding.iter().any(|o| o.pid() == pid),
                "{:?} while {:?} is outstanding",
                a,
                outstanding.iter().find(|o| o.pid() == pid)
            );
            if let Action::Release(_) = a {
                for (q, other) in &known {
                    if other.job == k.job {
                        continue;
                    }
                    prop_assert!(
                        !other.open,
                        "release of {pid} ({}) while {q} ({}) may run",
                        k.job,
                        other.job
                    );
                    prop_assert!(
                        !outstanding.contains(&Action::Release(*q)),
                        "release of {pid} while a release of {q} is outstanding"
                    );
                }
            }
            outstanding.push_back(a);
        }
        if let Some(d) = s.next_deadline() {
            prop_assert!(d > now, "a deadline not after the tick: a busy loop");
        }
        let report = s.report(now);
        let running = report.iter().filter(|r| r.running).count();
        prop_assert!(running <= 1, "{running} jobs running: {report:?}");
        for r in &report {
            prop_assert!((0.0..=1.0).contains(&r.achieved_share), "{r:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_two_jobs_released_at_once(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops)?;
    }
}
