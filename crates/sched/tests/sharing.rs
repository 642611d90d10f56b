//! The scheduler's decisions on a simulated GPU (see `sim/mod.rs`): shares, limits, work
//! conservation, swaps, jobs leaving, failed holds, live configuration changes.

mod sim;

use std::time::Duration;

use cudaw_sched::{Action, Config};
use sim::{config, Load, Sim, GIB};

const MINUTE: u64 = 60_000;

fn share(sim: &Sim, job: &str, total_ms: u64) -> f64 {
    sim.busy_ms(job) as f64 / total_ms as f64
}

/// Busy jobs with these requests share one GPU for a minute: each job's GPU time (measured
/// by the simulated GPU, and by the scheduler's own report) is within `tolerance` of its
/// request.
fn fair(jobs: &[(&str, f64)], tolerance: f64) {
    let cfg = config(&jobs.iter().map(|&(id, r)| (id, r, 1.0)).collect::<Vec<_>>());
    let mut sim = Sim::new(80 * GIB, &cfg);
    for (i, (id, _)) in jobs.iter().enumerate() {
        sim.spawn(100 + i as u32, id, Load::Busy, GIB, true);
    }
    sim.run(MINUTE);
    for &(id, request) in jobs {
        let got = share(&sim, id, MINUTE);
        let reported = sim.report(id).achieved_share;
        eprintln!("{id}: request {request}, GPU share {got:.4}, reported {reported:.4}");
        assert!(
            (got - request).abs() <= tolerance,
            "{id}: GPU share {got:.4}, expected {request} ± {tolerance} (all: {:?})",
            sim.busy
        );
        assert!(
            (reported - request).abs() <= tolerance,
            "{id}: reported share {reported:.4}, expected {request} ± {tolerance}"
        );
    }
    assert!(
        sim.overlap_ms <= 3 * jobs.len() as u64,
        "two jobs ran at once for {} ms (only while strays found running are held)",
        sim.overlap_ms
    );
}

#[test]
fn shares_quarter_and_three_quarters() {
    fair(&[("a", 0.25), ("b", 0.75)], 0.02);
}

#[test]
fn shares_tenth_and_nine_tenths() {
    fair(&[("a", 0.1), ("b", 0.9)], 0.03);
}

#[test]
fn shares_four_equal() {
    fair(&[("a", 0.25), ("b", 0.25), ("c", 0.25), ("d", 0.25)], 0.02);
}

#[test]
fn jobs_without_requests_share_what_is_left_equally() {
    // Two unnamed jobs (request 0) beside one of 0.5: a quarter each.
    let cfg = config(&[("a", 0.5, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "a", Load::Busy, GIB, true);
    sim.spawn(2, "pid-2", Load::Busy, GIB, true);
    sim.spawn(3, "pid-3", Load::Busy, GIB, true);
    sim.run(MINUTE);
    for (id, want) in [("a", 0.5), ("pid-2", 0.25), ("pid-3", 0.25)] {
        let got = share(&sim, id, MINUTE);
        assert!(
            (got - want).abs() <= 0.02,
            "{id}: {got:.4}, expected {want}"
        );
    }
}

#[test]
fn one_job_alone_is_never_held() {
    let mut sim = Sim::new(80 * GIB, &Config::default());
    sim.spawn(1, "solo", Load::Busy, GIB, true);
    sim.run(MINUTE);
    assert_eq!(sim.given, vec![], "a job alone pays nothing");
    assert_eq!(sim.busy_ms("solo"), MINUTE);
    assert!(sim.report("solo").running);

    // Bursty alone: no hold either (it never waits: its gate stays open).
    let mut sim = Sim::new(80 * GIB, &Config::default());
    sim.spawn(
        1,
        "solo",
        Load::Bursty {
            period_ms: 100,
            work_ms: 30,
        },
        GIB,
        true,
    );
    sim.run(MINUTE);
    assert_eq!(sim.holds(), 0);
}

#[test]
fn limit_holds_a_job_alone() {
    let cfg = config(&[("capped", 0.0, 0.3)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "capped", Load::Busy, GIB, true);
    sim.run(MINUTE);
    let got = share(&sim, "capped", MINUTE);
    eprintln!("limit 0.3 alone: {got:.4}, {} holds", sim.holds());
    assert!(got <= 0.31, "limit 0.3: got {got:.4}");
    assert!(got >= 0.28, "limit 0.3: got only {got:.4}");
    let reported = sim.report("capped").achieved_share;
    assert!(reported <= 0.31, "reported {reported:.4}");
}

#[test]
fn limit_gives_the_rest_to_others() {
    // By weights a would get 0.2 / 0.7 of the GPU; its limit caps it at 0.2, and b gets the
    // rest.
    let cfg = config(&[("a", 0.2, 0.2), ("b", 0.5, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "a", Load::Busy, GIB, true);
    sim.spawn(2, "b", Load::Busy, GIB, true);
    sim.run(MINUTE);
    let a = share(&sim, "a", MINUTE);
    let b = share(&sim, "b", MINUTE);
    assert!((0.18..=0.21).contains(&a), "a: {a:.4}");
    assert!(b >= 0.78, "b: {b:.4}");
}

#[test]
fn an_idle_jobs_share_goes_to_the_busy_one() {
    let cfg = config(&[("busy", 0.5, 1.0), ("idle", 0.5, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "busy", Load::Busy, GIB, true);
    sim.spawn(2, "idle", Load::Idle, GIB, true);
    sim.run(MINUTE);
    let got = share(&sim, "busy", MINUTE);
    assert!(got >= 0.97, "busy: {got:.4}");
    // Holding the idle process found running is the only hold.
    assert_eq!(sim.holds(), 1, "{:?}", sim.given);
}

#[test]
fn a_bursty_job_gets_its_work_done_and_the_rest_goes_to_the_busy_one() {
    let cfg = config(&[("busy", 0.5, 1.0), ("bursty", 0.5, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "busy", Load::Busy, GIB, true);
    // 20% of the GPU's time in bursts of 40 ms every 200 ms.
    sim.spawn(
        2,
        "bursty",
        Load::Bursty {
            period_ms: 200,
            work_ms: 40,
        },
        GIB,
        true,
    );
    sim.run(MINUTE);
    let bursty = share(&sim, "bursty", MINUTE);
    let busy = share(&sim, "busy", MINUTE);
    assert!(
        (bursty - 0.2).abs() <= 0.01,
        "bursty: {bursty:.4} of its 0.2"
    );
    // Its turns last a whole quantum (its gate open, idle after its burst): the busy job
    // loses at most that.
    assert!(busy >= 0.6, "busy: {busy:.4}");
    assert!(sim.report("bursty").waits > 100);
}

/// Checks each swap out against the job whose turn it made room for (the next release's):
/// the victim was the least recently run of the jobs that could have gone, and never of a
/// higher priority. Returns how many swap outs it checked.
fn check_swap_order(sim: &Sim) -> usize {
    let mut checked = 0;
    for (ms, victim, others) in &sim.swap_outs {
        let next = sim
            .given
            .iter()
            .find(|(t, a)| *t >= *ms && matches!(a, Action::Release(_)))
            .map(|(_, a)| a.pid());
        let Some(next) = next else { continue };
        let Some(turn) = sim
            .done
            .iter()
            .find(|d| d.action == Action::Release(next))
            .and(sim.job_of(next))
        else {
            continue;
        };
        let prio = |j: &str| sim.priority.get(j).copied().unwrap_or(0);
        assert!(
            prio(victim) <= prio(&turn),
            "at {ms} ms: {victim} (priority {}) swapped out for {turn} (priority {})",
            prio(victim),
            prio(&turn)
        );
        let victim_run = sim_last_run_before(sim, victim, *ms);
        for other in others {
            if *other == turn || prio(other) > prio(&turn) {
                continue;
            }
            let other_run = sim_last_run_before(sim, other, *ms);
            assert!(
                victim_run <= other_run,
                "at {ms} ms: {victim} (last run {victim_run} ms) swapped out before {other} \
                 (last run {other_run} ms) for {turn}"
            );
        }
        checked += 1;
    }
    checked
}

/// When a job's last turn before `ms` ended (its last hold done), 0 if none.
fn sim_last_run_before(sim: &Sim, job: &str, ms: u64) -> u64 {
    sim.done
        .iter()
        .filter(|d| {
            d.ok && d.done_ms <= ms
                && matches!(d.action, Action::Hold(_))
                && sim.job_of(d.action.pid()).as_deref() == Some(job)
        })
        .map(|d| d.done_ms)
        .max()
        .unwrap_or(0)
}

#[test]
fn three_jobs_of_35_gib_on_80_gib_take_turns_by_swapping() {
    let cfg = config(&[("a", 0.0, 1.0), ("b", 0.0, 1.0), ("c", 0.0, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "a", Load::Busy, 35 * GIB, true);
    sim.spawn(2, "b", Load::Busy, 35 * GIB, true);
    // The third does not fit: its allocation waits.
    sim.spawn(3, "c", Load::Busy, 35 * GIB, false);
    sim.run(3 * MINUTE);
    let total: u64 = ["a", "b", "c"].iter().map(|j| sim.busy_ms(j)).sum();
    for (pid, j) in [(1, "a"), (2, "b"), (3, "c")] {
        let got = share(&sim, j, 3 * MINUTE);
        assert!(
            got >= 0.25,
            "{j}: {got:.4} of the GPU's time (all: {:?})",
            sim.busy
        );
        let r = sim.report(j);
        assert!(r.swaps >= 3, "{j} was swapped out {}", r.swaps);
        // What was resident at each swap: its 35 GiB each time.
        assert_eq!(r.swapped_out_bytes, r.swaps * 35 * GIB, "{j}: {r:?}");
        // Its launches: the work its process did (1 ms a launch in the simulation).
        assert_eq!(r.launches, sim.procs[&pid].progress, "{j}");
    }
    // The swaps cost at most a fifth of the GPU's time.
    assert!(
        total as f64 >= 0.8 * (3 * MINUTE) as f64,
        "GPU busy {total} ms of {}",
        3 * MINUTE
    );
    eprintln!("busy {:?}, swaps {}", sim.busy, sim.swap_outs.len());
    let failed: Vec<_> = sim.done.iter().filter(|d| !d.ok).collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(check_swap_order(&sim) >= 10);
}

#[test]
fn a_running_job_whose_allocation_waits_gets_room() {
    let cfg = config(&[("grow", 0.5, 1.0), ("idle", 0.5, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "grow", Load::Busy, 35 * GIB, true);
    sim.spawn(2, "idle", Load::Idle, 35 * GIB, true);
    sim.run(1_000);
    // It allocates 20 GiB more: 90 GiB on a card of 80. The idle job is swapped out.
    sim.procs.get_mut(&1).expect("spawned").footprint = 55 * GIB;
    sim.reset_busy();
    sim.run(5_000);
    assert_eq!(sim.procs[&2].swapped, 35 * GIB);
    assert_eq!(sim.procs[&1].resident, 55 * GIB);
    // The swap (35 GiB at 50 GiB/s) and a poll: the rest of the 5 s is its.
    assert!(sim.busy_ms("grow") >= 4_200, "{:?}", sim.busy);
    assert_eq!(sim.report("idle").swaps, 1);
    assert_eq!(sim.holds(), 1, "the running job was not held for it");
}

#[test]
fn a_job_dying_while_swapped_out_frees_the_others() {
    let cfg = config(&[("a", 0.0, 1.0), ("b", 0.0, 1.0), ("c", 0.0, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "a", Load::Busy, 35 * GIB, true);
    sim.spawn(2, "b", Load::Busy, 35 * GIB, true);
    sim.spawn(3, "c", Load::Busy, 35 * GIB, false);
    // Run until some job is swapped out, then it dies.
    let mut dead = None;
    for _ in 0..60_000 {
        sim.run(1);
        dead = sim
            .procs
            .iter()
            .find(|(_, p)| p.swapped > 0)
            .map(|(&pid, _)| pid);
        if dead.is_some() {
            break;
        }
    }
    let dead = dead.expect("a job was swapped out");
    sim.kill(dead);
    let swaps_before = sim.swap_outs.len();
    sim.reset_busy();
    sim.run(MINUTE);
    // The two left fit together: they share the GPU with no more swaps.
    assert_eq!(sim.swap_outs.len(), swaps_before, "swapped after the death");
    for (&pid, p) in &sim.procs {
        let got = share(&sim, &p.job, MINUTE);
        assert!((got - 0.5).abs() <= 0.02, "{pid} ({}): {got:.4}", p.job);
    }
    assert_eq!(sim.sched.report(sim.now()).len(), 2);
}

#[test]
fn a_higher_priority_job_is_never_swapped_out_for_a_lower() {
    let text = r#"
        [[job]]
        id = "high"
        priority = 10
        [[job]]
        id = "b"
        [[job]]
        id = "c"
    "#;
    let cfg = Config::parse(text).expect("valid");
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.priority.insert("high".into(), 10);
    sim.spawn(1, "high", Load::Busy, 35 * GIB, true);
    sim.spawn(2, "b", Load::Busy, 35 * GIB, true);
    sim.spawn(3, "c", Load::Busy, 35 * GIB, false);
    sim.run(2 * MINUTE);
    assert!(
        !sim.given.contains(&(0, Action::SwapOut(1)))
            && !sim.given.iter().any(|(_, a)| *a == Action::SwapOut(1)),
        "the high-priority job was swapped out"
    );
    for j in ["high", "b", "c"] {
        assert!(
            sim.busy_ms(j) > 10_000,
            "{j} made no progress: {:?}",
            sim.busy
        );
    }
    assert!(check_swap_order(&sim) >= 5);
}

#[test]
fn a_job_that_cannot_fit_waits_and_says_so() {
    // Two high-priority jobs fill the card: the low one can swap out neither.
    let text = r#"
        [[job]]
        id = "h1"
        priority = 5
        [[job]]
        id = "h2"
        priority = 5
        [[job]]
        id = "low"
    "#;
    let cfg = Config::parse(text).expect("valid");
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "h1", Load::Busy, 40 * GIB, true);
    sim.spawn(2, "h2", Load::Busy, 40 * GIB, true);
    sim.spawn(3, "low", Load::Busy, 10 * GIB, false);
    sim.run(10_000);
    assert_eq!(sim.busy_ms("low"), 0);
    assert!(sim.report("low").memory_waits >= 1);
    assert!(
        sim.busy_ms("h1") > 4_000 && sim.busy_ms("h2") > 4_000,
        "{:?}",
        sim.busy
    );
    assert!(!sim
        .given
        .iter()
        .any(|(_, a)| matches!(a, Action::SwapOut(_))));
}

/// Three busy jobs of 35 GiB on an 80 GiB card (the third not yet resident: it waits),
/// with `room` bytes of host memory for swaps.
fn three_of_35_gib_with_host_room(room: u64) -> Sim {
    let cfg = config(&[("a", 0.0, 1.0), ("b", 0.0, 1.0), ("c", 0.0, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.sched.host_room(Some(room));
    sim.spawn(1, "a", Load::Busy, 35 * GIB, true);
    sim.spawn(2, "b", Load::Busy, 35 * GIB, true);
    sim.spawn(3, "c", Load::Busy, 35 * GIB, false);
    sim
}

#[test]
fn host_memory_is_not_overcommitted_by_swaps() {
    // Three jobs of 35 GiB on 80 GiB, and room for 30 GiB in the host's memory: no job
    // can be swapped out, so the third waits for memory while the two others share.
    let mut sim = three_of_35_gib_with_host_room(30 * GIB);
    sim.run(10_000);
    assert_eq!(sim.busy_ms("c"), 0, "{:?}", sim.busy);
    assert!(sim.report("c").memory_waits >= 1);
    assert!(!sim
        .given
        .iter()
        .any(|(_, a)| matches!(a, Action::SwapOut(_))));
    assert!(
        sim.busy_ms("a") > 3_000 && sim.busy_ms("b") > 3_000,
        "{:?}",
        sim.busy
    );
    // Room for one job's memory: swaps come, and the third runs.
    sim.sched.host_room(Some(36 * GIB));
    sim.run(20_000);
    assert!(sim.busy_ms("c") > 2_000, "{:?}", sim.busy);
}

#[test]
fn a_swap_into_host_memory_the_job_keeps_costs_the_host_nothing_new() {
    // 30 GiB of room, but each job keeps 10 GiB in host memory (its arena): a swap
    // costs 25 GiB, which fits.
    let mut sim = three_of_35_gib_with_host_room(30 * GIB);
    for pid in [1, 2, 3] {
        sim.procs.get_mut(&pid).unwrap().host_kept = 10 * GIB;
    }
    sim.run(20_000);
    assert!(sim.busy_ms("c") > 2_000, "{:?}", sim.busy);
}

#[test]
fn a_job_leaving_mid_quantum_hands_the_gpu_on() {
    let cfg = config(&[("a", 0.5, 1.0), ("b", 0.5, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "a", Load::Busy, GIB, true);
    sim.spawn(2, "b", Load::Busy, GIB, true);
    sim.run(1_000);
    // Run until a is mid-quantum, then it exits.
    while !sim.report("a").running {
        sim.run(1);
    }
    sim.run(20);
    let left_at = sim.ms;
    sim.kill(1);
    sim.reset_busy();
    sim.run(5_000);
    assert!(
        sim.busy_ms("b") >= 5_000 - 20,
        "b got {} ms of 5000 after a left",
        sim.busy_ms("b")
    );
    assert!(
        !sim.given.iter().any(|(t, a)| *t >= left_at && a.pid() == 1),
        "an action for the process that left"
    );
    assert_eq!(sim.sched.report(sim.now()).len(), 1);
}

#[test]
fn a_failed_hold_keeps_the_job_running_until_a_hold_succeeds() {
    let cfg = config(&[("a", 0.5, 1.0), ("b", 0.5, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "a", Load::Busy, GIB, true);
    sim.spawn(2, "b", Load::Busy, GIB, true);
    sim.run(500);
    // a's next three holds fail (its process does not answer in time).
    sim.fail_holds.insert(1, 3);
    sim.run(MINUTE);
    let fails = sim
        .done
        .iter()
        .filter(|d| !d.ok && d.action == Action::Hold(1))
        .count();
    assert_eq!(fails, 3);
    // The sim asserts at each release that no other job's process may run; the shares
    // recover.
    for j in ["a", "b"] {
        let got = share(&sim, j, MINUTE);
        assert!((got - 0.5).abs() <= 0.03, "{j}: {got:.4}");
    }
}

#[test]
fn a_config_change_applies_within_a_few_quanta() {
    let mut sim = Sim::new(80 * GIB, &config(&[("a", 0.5, 1.0), ("b", 0.5, 1.0)]));
    sim.spawn(1, "a", Load::Busy, GIB, true);
    sim.spawn(2, "b", Load::Busy, GIB, true);
    sim.run(20_000);
    let a = share(&sim, "a", 20_000);
    assert!((a - 0.5).abs() <= 0.02, "a before: {a:.4}");
    let now = sim.now();
    sim.sched
        .set_config(&config(&[("a", 0.2, 1.0), ("b", 0.8, 1.0)]), now);
    // Within a few quanta (here 500 ms: 10 quanta) the new shares hold.
    sim.run(500);
    sim.reset_busy();
    sim.run(5_000);
    let a = share(&sim, "a", 5_000);
    let b = share(&sim, "b", 5_000);
    assert!((a - 0.2).abs() <= 0.03, "a after: {a:.4}");
    assert!((b - 0.8).abs() <= 0.03, "b after: {b:.4}");
    assert_eq!(sim.report("a").request, 0.2);
}

#[test]
fn quanta_lengthen_for_jobs_whose_holds_drain_slowly() {
    let cfg = config(&[("a", 0.5, 1.0), ("b", 0.5, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.spawn(1, "a", Load::Busy, GIB, true);
    sim.spawn(2, "b", Load::Busy, GIB, true);
    sim.run(2_000);
    // Holds drain in 1–3 ms: 20 × that stays under the configured 50 ms.
    assert_eq!(sim.sched.job_quantum("a"), Some(Duration::from_millis(50)));

    // Holds that drain in 6 ms: quanta of 120 ms, so a switch costs 5% of a turn; the
    // shares hold.
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.hold_ms = Some(6);
    sim.spawn(1, "a", Load::Busy, GIB, true);
    sim.spawn(2, "b", Load::Busy, GIB, true);
    sim.run(MINUTE);
    assert_eq!(sim.sched.job_quantum("a"), Some(Duration::from_millis(120)));
    assert_eq!(sim.report("b").quantum_seconds, 0.12);
    for j in ["a", "b"] {
        let got = share(&sim, j, MINUTE);
        assert!((got - 0.5).abs() <= 0.02, "{j}: {got:.4}");
    }
    // 60 s in turns of about 126 ms: about 480 holds, not the 1,100 of 50 ms quanta.
    assert!(sim.holds() < 600, "{} holds", sim.holds());

    // Drains past max_quantum / 20 stop at max_quantum.
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.hold_ms = Some(40);
    sim.spawn(1, "a", Load::Busy, GIB, true);
    sim.spawn(2, "b", Load::Busy, GIB, true);
    sim.run(5_000);
    assert_eq!(sim.sched.job_quantum("a"), Some(Duration::from_millis(200)));
}

#[test]
fn a_jobs_launches_count_its_processes_once_and_never_go_down() {
    use cudaw_sched::Observation;
    use std::time::Instant;
    let cfg = config(&[("a", 0.0, 1.0)]);
    let mut s = cudaw_sched::Scheduler::new(80 * GIB, &cfg);
    let now = Instant::now();
    let seen = |launches| Observation {
        launches,
        ..Observation::default()
    };
    let launches = |s: &cudaw_sched::Scheduler| {
        s.report(now)
            .iter()
            .find(|j| j.id == "a")
            .map_or(0, |j| j.launches)
    };
    s.join(1, "a", now);
    s.join(2, "a", now);
    s.observe(1, seen(10), now);
    s.observe(2, seen(5), now);
    assert_eq!(launches(&s), 15);
    // Process 1 leaves (an operator paused it) and comes back: counted once, and not
    // below what it had while its first status is awaited.
    s.leave(1, now);
    assert_eq!(launches(&s), 15);
    s.join(1, "a", now);
    assert_eq!(launches(&s), 15);
    s.observe(1, seen(12), now);
    assert_eq!(launches(&s), 17);
    // Process 2 exits: its launches stay the job's.
    s.leave(2, now);
    assert_eq!(launches(&s), 17);
}

#[test]
fn memory_the_accounting_misses_is_learnt_from_an_allocation_that_keeps_waiting() {
    // The card holds 2 GiB the accounting does not see (the processes' contexts): two
    // jobs of 38 GiB and a third asking for 4 GiB fit by the accounting, not on the card.
    let cfg = config(&[("a", 0.0, 1.0), ("b", 0.0, 1.0), ("c", 0.0, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.capacity = 78 * GIB;
    sim.spawn(1, "a", Load::Busy, 38 * GIB, true);
    sim.spawn(2, "b", Load::Busy, 38 * GIB, true);
    sim.spawn(3, "c", Load::Busy, 4 * GIB, false);
    sim.run(30_000);
    // The third got its memory (another job was swapped out for it) and ran its share.
    assert!(sim.report("c").launches > 0, "{:?}", sim.busy);
    assert!(share(&sim, "c", 30_000) >= 0.1, "{:?}", sim.busy);
    assert!(sim.sched.unseen() > 0);
    assert!(sim.swap_outs.len() >= 2, "{:?}", sim.swap_outs);
    let failed: Vec<_> = sim.done.iter().filter(|d| !d.ok).collect();
    assert!(failed.is_empty(), "{failed:?}");
}

#[test]
fn nothing_is_learnt_where_the_capacity_is_unknown() {
    // The daemon passes u64::MAX when it cannot read the card's memory: nothing is swapped
    // for room then, and no unseen memory is made up from the waits.
    let cfg = config(&[("a", 0.0, 1.0), ("b", 0.0, 1.0), ("c", 0.0, 1.0)]);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.sched = cudaw_sched::Scheduler::new(u64::MAX, &cfg);
    sim.capacity = 78 * GIB;
    sim.spawn(1, "a", Load::Busy, 38 * GIB, true);
    sim.spawn(2, "b", Load::Busy, 38 * GIB, true);
    sim.spawn(3, "c", Load::Busy, 4 * GIB, false);
    sim.run(5_000);
    assert_eq!(sim.sched.unseen(), 0);
    assert!(sim.swap_outs.is_empty(), "{:?}", sim.swap_outs);
}

/// Jobs a (request `small`) and b (the rest) on one GPU with quanta fixed at 10 ms, the
/// daemon looking every `poll_ms`, a hold draining in `hold_ms`; b's processes `b_loads`
/// (looked at in PID order). a's share of a minute, after two seconds to settle.
fn ten_ms_quanta(small: f64, poll_ms: u64, hold_ms: u64, b_loads: &[Load]) -> f64 {
    let mut cfg = config(&[("a", small, 1.0), ("b", 1.0 - small, 1.0)]);
    cfg.quantum = Duration::from_millis(10);
    cfg.min_quantum = Duration::from_millis(10);
    cfg.max_quantum = Duration::from_millis(10);
    let mut sim = Sim::new(80 * GIB, &cfg);
    sim.poll_ms = poll_ms;
    sim.hold_ms = Some(hold_ms);
    sim.spawn(100, "a", Load::Busy, GIB, true);
    for (pid, &load) in (101..).zip(b_loads) {
        sim.spawn(pid, "b", load, GIB, true);
    }
    sim.run(2_000);
    sim.reset_busy();
    sim.run(MINUTE);
    share(&sim, "a", MINUTE)
}

/// Fixed quanta shorter than the daemon's poll (the H200 run with `quantum = min_quantum =
/// max_quantum = "10ms"` gave 0.33 / 0.67 where 0.25 / 0.75 was asked, by the daemon's own
/// accounting too): a job held at the end of its quantum is seen waiting again only at the
/// next poll, while the other job runs. It had not been idle: its virtual time must not be
/// raised to the running job's, which grows during the run.
#[test]
fn quanta_shorter_than_the_poll_keep_the_shares() {
    for (small, poll_ms, hold_ms) in [(0.25, 20, 5), (0.1, 20, 5), (0.25, 20, 1), (0.1, 10, 3)] {
        let got = ten_ms_quanta(small, poll_ms, hold_ms, &[Load::Busy]);
        eprintln!("request {small}, poll {poll_ms} ms, drain {hold_ms} ms: a got {got:.4}");
        assert!(
            (got - small).abs() <= small * 0.1,
            "request {small}, poll {poll_ms} ms, drain {hold_ms} ms: a got {got:.4}"
        );
    }
}

/// The same with a job of two processes, one idle and looked at first (the review's case):
/// the idle one's look must not end the credit before the busy one is seen waiting.
#[test]
fn a_jobs_idle_process_looked_at_first_keeps_the_busy_ones_credit() {
    for small in [0.25, 0.1] {
        let got = ten_ms_quanta(small, 20, 5, &[Load::Idle, Load::Busy]);
        eprintln!("request {small}: a got {got:.4}");
        assert!(
            (got - small).abs() <= small * 0.1,
            "request {small}: a got {got:.4}"
        );
    }
}

/// A process found paused with its memory swapped out (an earlier daemon's swap) that
/// joins first is "found running" (its turn begins at its join, before anything is seen
/// of it). Its memory must come back before it runs: with the other job idle its turn is
/// never ended by a quantum, and the node test that adopted such a job once waited for
/// ever (CI of 97b6c94: the job listed running, 21.3 MiB swapped, nothing resumed).
#[test]
fn a_job_found_swapped_out_at_its_join_is_swapped_in_before_it_runs() {
    use cudaw_sched::{Action, Observation, Outcome, Scheduler};
    use std::time::Instant;
    const MIB: u64 = 1 << 20;
    let cfg = config(&[("a", 0.0, 1.0), ("b", 0.0, 1.0)]);
    let mut s = Scheduler::new(24 * MIB, &cfg);
    let t0 = Instant::now();
    let swapped = |waiting| Observation {
        swapped: 21 * MIB,
        waiting,
        ..Observation::default()
    };
    s.join(1, "a", t0);
    s.observe(1, swapped(false), t0);
    s.join(2, "b", t0);
    s.observe(
        2,
        Observation {
            resident: 14 * MIB,
            ..Observation::default()
        },
        t0,
    );
    let mut t = t0;
    let mut order = Vec::new();
    for step in 0..500 {
        t += Duration::from_millis(10);
        if step == 2 {
            // The first job's program wants the GPU (it waits at its closed gate).
            s.observe(1, swapped(true), t);
        }
        for a in s.tick(t) {
            if matches!(a, Action::SwapIn(_) | Action::SwapOut(_)) {
                order.push(a.clone());
            }
            s.done(&a, Outcome::Done, t);
        }
        if order.contains(&Action::SwapIn(1)) {
            break;
        }
    }
    assert_eq!(order, [Action::SwapOut(2), Action::SwapIn(1)]);
}
