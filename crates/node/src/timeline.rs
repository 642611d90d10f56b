//! The daemon's decisions as a timeline (`CUDAW_TRACE=timeline` in the daemon's
//! environment): Chrome trace-event JSON, which Perfetto and `chrome://tracing` open, the
//! format of the processes' own timelines. Each GPU is a "process" of the viewer
//! (`GPU GPU-… (ordinal 0 in its processes)`), each job a "thread" of it; a job's slices are its turns (from its
//! release done to the hold that ended it), the holds draining its work, and its swaps out
//! and in, each from the moment the daemon asked to the moment the process answered.
//! Written when the daemon stops, to `CUDAW_TRACE_FILE` (`%p`: the daemon's PID), else
//! `cudaw-node-PID.trace.json` in its working folder. The newest [`MAX_EVENTS`] are kept.

use cudaw_sched::Action;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The most slices kept (the oldest go first): about 50 bytes each in memory, 25 MB.
pub const MAX_EVENTS: usize = 500_000;

/// One slice.
struct Slice {
    name: &'static str,
    failed: bool,
    gpu: u32,
    tid: u32,
    pid: u32,
    start_us: f64,
    dur_us: f64,
}

/// The daemon's timeline.
pub struct Timeline {
    path: PathBuf,
    t0: Instant,
    events: VecDeque<Slice>,
    dropped: u64,
    /// Actions asked for and not yet answered: (process, action) → when asked.
    asked: HashMap<(u32, &'static str), Instant>,
    /// Turns under way: (process, GPU's UUID) → since when.
    turns: HashMap<(u32, String), Instant>,
    /// Jobs by name → their thread number in the viewer.
    jobs: BTreeMap<String, u32>,
    /// GPUs by UUID → (their number in the viewer, the index a process gave them).
    gpus: BTreeMap<String, (u32, i32)>,
}

impl Timeline {
    /// The timeline the environment asks for (`CUDAW_TRACE=timeline`), if any.
    pub fn from_env() -> Option<Timeline> {
        if std::env::var("CUDAW_TRACE").ok()?.trim() != "timeline" {
            return None;
        }
        let configured = std::env::var_os("CUDAW_TRACE_FILE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        Some(Timeline::new(&file_for(
            configured.as_deref(),
            std::process::id(),
        )))
    }

    /// An empty timeline that [`Timeline::write`] puts in `path`.
    pub fn new(path: &Path) -> Timeline {
        Timeline {
            path: path.to_path_buf(),
            t0: Instant::now(),
            events: VecDeque::new(),
            dropped: 0,
            asked: HashMap::new(),
            turns: HashMap::new(),
            jobs: BTreeMap::new(),
            gpus: BTreeMap::new(),
        }
    }

    /// Where it is written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The daemon asked process `pid` for `action`.
    pub fn asked(&mut self, pid: u32, action: &Action, now: Instant) {
        self.asked.insert((pid, action.name()), now);
    }

    /// Process `pid` of `job` answered `action` (given by the GPU `uuid`, which the
    /// process calls `index`); `ok`: it was done.
    pub fn done(
        &mut self,
        pid: u32,
        job: &str,
        (index, uuid): (i32, &str),
        action: &Action,
        ok: bool,
        now: Instant,
    ) {
        let n = self.gpus.len() as u32;
        let gpu = self.gpus.entry(uuid.to_owned()).or_insert((n, index)).0;
        let what = action.name();
        let asked = self.asked.remove(&(pid, what)).unwrap_or(now);
        let key = (pid, uuid.to_owned());
        match action {
            Action::Release(_) if ok => {
                self.turns.insert(key, now);
            }
            // A failed hold leaves the job on the GPU: its turn goes on.
            Action::Hold(_) if ok => {
                if let Some(start) = self.turns.remove(&key) {
                    self.slice("turn", false, pid, job, gpu, start, asked);
                }
            }
            _ => {}
        }
        if !matches!(action, Action::Release(_)) {
            self.slice(what, !ok, pid, job, gpu, asked, now);
        }
    }

    /// Process `pid` left: a turn under way ends now.
    pub fn left(&mut self, pid: u32, job: &str, now: Instant) {
        let ended: Vec<(u32, String)> = self
            .turns
            .keys()
            .filter(|(p, _)| *p == pid)
            .cloned()
            .collect();
        for key in ended {
            if let Some(start) = self.turns.remove(&key) {
                let gpu = self.gpus.get(&key.1).map_or(0, |g| g.0);
                self.slice("turn", false, pid, job, gpu, start, now);
            }
        }
        self.asked.retain(|(p, _), _| *p != pid);
    }

    fn micros(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64() * 1e6
    }

    #[allow(clippy::too_many_arguments)]
    fn slice(
        &mut self,
        name: &'static str,
        failed: bool,
        pid: u32,
        job: &str,
        gpu: u32,
        start: Instant,
        end: Instant,
    ) {
        let n = self.jobs.len() as u32 + 1;
        let tid = *self.jobs.entry(job.to_owned()).or_insert(n);
        let start_us = self.micros(start);
        let dur_us = (self.micros(end) - start_us).max(0.0);
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(Slice {
            name,
            failed,
            gpu,
            tid,
            pid,
            start_us,
            dur_us,
        });
    }

    /// The whole timeline as Chrome trace-event JSON.
    pub fn to_json(&self) -> Value {
        let mut events: Vec<Value> = Vec::with_capacity(self.events.len() + 8);
        let jobs: BTreeMap<u32, &String> = self.jobs.iter().map(|(j, t)| (*t, j)).collect();
        for (uuid, (n, index)) in &self.gpus {
            events.push(
                json!({"name": "process_name", "ph": "M", "pid": n, "tid": 0,
                "args": {"name": format!("GPU {uuid} (ordinal {index} in its processes)")}}),
            );
            for (tid, job) in &jobs {
                events.push(json!({"name": "thread_name", "ph": "M", "pid": n,
                    "tid": tid, "args": {"name": job}}));
            }
        }
        for e in &self.events {
            let name = if e.failed {
                format!("{} (failed)", e.name)
            } else {
                e.name.to_owned()
            };
            events.push(json!({
                "name": name, "cat": "node", "ph": "X", "pid": e.gpu, "tid": e.tid,
                "ts": e.start_us, "dur": e.dur_us,
                "args": {"job": jobs.get(&e.tid), "pid": e.pid},
            }));
        }
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"source": "cudaw node", "dropped": self.dropped},
        })
    }

    /// Writes it to its file (a new file renamed over the old); the number of slices.
    pub fn write(&self) -> std::io::Result<usize> {
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&self.to_json())?)?;
        std::fs::rename(&tmp, &self.path)?;
        Ok(self.events.len())
    }
}

/// `configured` with `%p` standing for `pid`, else `cudaw-node-PID.trace.json`.
fn file_for(configured: Option<&Path>, pid: u32) -> PathBuf {
    match configured {
        Some(p) => PathBuf::from(p.to_string_lossy().replace("%p", &pid.to_string())),
        None => PathBuf::from(format!("cudaw-node-{pid}.trace.json")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn turns_holds_and_swaps_are_slices_of_their_job_on_their_gpu() {
        let d = tempfile::tempdir().unwrap();
        let mut t = Timeline::new(&d.path().join("node.trace.json"));
        let t0 = t.t0;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let gpu = (0, "GPU-abc");
        t.asked(7, &Action::Release(7), at(1));
        t.done(7, "a", gpu, &Action::Release(7), true, at(2));
        t.asked(7, &Action::Hold(7), at(52));
        t.done(7, "a", gpu, &Action::Hold(7), true, at(54));
        t.asked(8, &Action::SwapOut(8), at(54));
        t.done(8, "b", gpu, &Action::SwapOut(8), false, at(90));
        t.asked(8, &Action::Release(8), at(90));
        t.done(8, "b", gpu, &Action::Release(8), true, at(91));
        t.left(8, "b", at(100));
        let v = t.to_json();
        let evs = v["traceEvents"].as_array().unwrap();
        let slices: Vec<(String, u64, u64, u64)> = evs
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["tid"].as_u64().unwrap(),
                    e["ts"].as_f64().unwrap() as u64 / 1000,
                    e["dur"].as_f64().unwrap() as u64 / 1000,
                )
            })
            .collect();
        assert_eq!(
            slices,
            vec![
                // Job a's turn: from its release done to the hold asked; then the hold.
                ("turn".into(), 1, 2, 50),
                ("hold".into(), 1, 52, 2),
                ("swap out (failed)".into(), 2, 54, 36),
                // Job b's turn ends when its process leaves.
                ("turn".into(), 2, 91, 9),
            ]
        );
        assert!(evs.iter().any(|e| e["name"] == "process_name"
            && e["args"]["name"] == "GPU GPU-abc (ordinal 0 in its processes)"));
        assert!(evs
            .iter()
            .any(|e| e["name"] == "thread_name" && e["tid"] == 2 && e["args"]["name"] == "b"));
        assert_eq!(t.write().unwrap(), 4);
        let back: Value =
            serde_json::from_slice(&std::fs::read(d.path().join("node.trace.json")).unwrap())
                .unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn the_file_is_named_after_the_daemon() {
        assert_eq!(
            file_for(None, 42),
            PathBuf::from("cudaw-node-42.trace.json")
        );
        assert_eq!(
            file_for(Some(Path::new("/t/n-%p.json")), 42),
            PathBuf::from("/t/n-42.json")
        );
    }
}
