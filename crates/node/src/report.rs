//! What the daemon reports: the status socket's JSON ([`NodeReport`], printed by `cudaw
//! node status`), its table, and the Prometheus text of `--metrics`.

use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// The daemon's state, as `cudaw node status --json` prints it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeReport {
    /// Each GPU the processes under cudaw use, in the order of their index.
    pub gpus: Vec<GpuReport>,
    /// The configuration file.
    pub config: ConfigReport,
    /// Every process found in the run folders, joined to a GPU or not yet.
    #[serde(default)]
    pub processes: Vec<ProcessRow>,
    /// The daemon's PID.
    #[serde(default)]
    pub pid: u32,
    /// The run folders it looks in.
    #[serde(default)]
    pub run_dirs: Vec<String>,
    /// The host memory swaps out may take now (available, less a reserve of 5%): a job
    /// whose memory does not fit there is not swapped out.
    #[serde(default)]
    pub host_room: Option<u64>,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuReport {
    /// The CUDA ordinal the first process found on it gave it.
    pub index: i32,
    /// Its UUID (`GPU-…`; `ordinal-N` when the driver gave none).
    pub uuid: String,
    /// Its memory in bytes, when known (the node ledger's capacity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// Device memory on it the accounting does not see (contexts, other programs), as
    /// learnt from allocations that waited where the accounting said they fit: jobs fit in
    /// the capacity less this.
    #[serde(default)]
    pub unseen_bytes: u64,
    /// Its jobs.
    pub jobs: Vec<JobRow>,
}

/// One job on one GPU (cudaw-sched's `JobReport`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct JobRow {
    /// The job's id (`cudaw run --job ID`, or `pid-PID`).
    pub id: String,
    /// Its processes on this GPU.
    pub pids: Vec<u32>,
    /// Its guaranteed share of the GPU's time (0–1).
    pub request: f64,
    /// Its largest share (0–1).
    pub limit: f64,
    /// Its memory limit in bytes, if any.
    pub memory: Option<u64>,
    /// Its priority (higher is swapped out later).
    #[serde(default)]
    pub priority: i32,
    /// The share of the GPU's time it had over the last minute (0–1).
    pub achieved_share: f64,
    /// Device memory resident now, in bytes.
    pub resident_bytes: u64,
    /// Device memory swapped out now, in bytes.
    pub swapped_bytes: u64,
    /// Times it was swapped out.
    pub swaps: u64,
    /// Times it waited for the GPU.
    pub waits: u64,
    /// Whether it holds the GPU now.
    pub running: bool,
    /// All the GPU time it had, in seconds.
    #[serde(default)]
    pub gpu_seconds: f64,
    /// Times it waited for memory (it did not fit, and nothing could be swapped out).
    #[serde(default)]
    pub memory_waits: u64,
    /// Bytes swapped out over all its swaps.
    #[serde(default)]
    pub swapped_out_bytes: u64,
    /// Its kernel launches (its processes', on all their GPUs).
    #[serde(default)]
    pub launches: u64,
}

impl From<&cudaw_sched::JobReport> for JobRow {
    fn from(j: &cudaw_sched::JobReport) -> JobRow {
        JobRow {
            id: j.id.clone(),
            pids: j.pids.clone(),
            request: j.request,
            limit: j.limit,
            memory: j.memory,
            priority: j.priority,
            achieved_share: j.achieved_share,
            resident_bytes: j.resident_bytes,
            swapped_bytes: j.swapped_bytes,
            swaps: j.swaps,
            waits: j.waits,
            running: j.running,
            gpu_seconds: j.gpu_seconds,
            memory_waits: j.memory_waits,
            swapped_out_bytes: j.swapped_out_bytes,
            launches: j.launches,
        }
    }
}

/// The configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ConfigReport {
    /// Its path.
    pub path: String,
    /// When the configuration in force was loaded (seconds since the Unix epoch).
    pub loaded: u64,
    /// Why the file as it is now is refused (the line and the reason), if it is: the
    /// configuration loaded before stays in force.
    pub error: Option<String>,
    /// The GPUs each job may run on (`gpus` in its `[[job]]`), for the jobs that say.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub gpus: std::collections::BTreeMap<String, Vec<String>>,
    /// The jobs the configuration names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<String>,
    /// The `[default]` table's `gpus`: those of a job it does not name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_gpus: Option<Vec<String>>,
}

/// A process found in a run folder.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ProcessRow {
    /// Its PID.
    pub pid: u32,
    /// Its job's id, once it answered.
    #[serde(default)]
    pub job: Option<String>,
    /// The GPUs it joined (UUIDs).
    #[serde(default)]
    pub gpus: Vec<String>,
    /// Why it is not on a GPU, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `n` bytes as `8.0 GiB`, `512.0 MiB`, `12 B`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The report as `cudaw node status` prints it; `now` is the time in seconds since the
/// Unix epoch (for the configuration's age).
pub fn table(r: &NodeReport, now: u64) -> String {
    let mut s = String::new();
    if r.gpus.is_empty() {
        let _ = writeln!(
            s,
            "no jobs: no process under cudaw holds device memory (found {} process{} in {})",
            r.processes.len(),
            if r.processes.len() == 1 { "" } else { "es" },
            if r.run_dirs.is_empty() {
                "no run folder".to_owned()
            } else {
                r.run_dirs.join(", ")
            }
        );
    }
    for g in &r.gpus {
        let cap = g
            .capacity
            .map(|c| format!(", {}", bytes(c)))
            .unwrap_or_default();
        let cap = if g.unseen_bytes > 0 {
            format!("{cap}, {} not cudaw's", bytes(g.unseen_bytes))
        } else {
            cap
        };
        let _ = writeln!(
            s,
            "GPU {} ({}{cap}): {} job{}",
            g.index,
            g.uuid,
            g.jobs.len(),
            if g.jobs.len() == 1 { "" } else { "s" }
        );
        let header = [
            "JOB", "PIDS", "REQUEST", "LIMIT", "SHARE", "MEMORY", "RESIDENT", "SWAPPED", "SWAPS",
            "WAITS", "RUNNING",
        ];
        let rows: Vec<[String; 11]> = g
            .jobs
            .iter()
            .map(|j| {
                [
                    j.id.clone(),
                    j.pids
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                    format!("{:.2}", j.request),
                    format!("{:.2}", j.limit),
                    format!("{:.2}", j.achieved_share),
                    j.memory.map_or_else(|| "-".to_owned(), bytes),
                    bytes(j.resident_bytes),
                    bytes(j.swapped_bytes),
                    j.swaps.to_string(),
                    j.waits.to_string(),
                    if j.running { "yes" } else { "no" }.to_owned(),
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for row in &rows {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut line = |cells: &[String]| {
            let mut l = String::from(" ");
            for (c, w) in cells.iter().zip(width) {
                let _ = write!(l, " {c:<w$}");
            }
            let _ = writeln!(s, "{}", l.trim_end());
        };
        line(&header.map(str::to_owned));
        for row in &rows {
            line(row);
        }
    }
    let waiting: Vec<String> = r
        .processes
        .iter()
        .filter(|p| p.gpus.is_empty())
        .map(|p| {
            format!(
                "{}{}",
                p.pid,
                p.note
                    .as_ref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if !waiting.is_empty() && !r.gpus.is_empty() {
        let _ = writeln!(s, "not on a GPU yet: {}", waiting.join(", "));
    }
    if let Some(room) = r.host_room {
        let _ = writeln!(s, "host memory swaps may take: {}", bytes(room));
    }
    let age = now.saturating_sub(r.config.loaded);
    let _ = writeln!(s, "config {} (loaded {age} s ago)", r.config.path);
    if let Some(e) = &r.config.error {
        let _ = writeln!(s, "config refused: {e}");
    }
    s
}

/// A Prometheus label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The report as Prometheus text (version 0.0.4): per job and GPU, its share, request,
/// limit, memory, swaps and waits; per GPU, its jobs.
pub fn prometheus(r: &NodeReport) -> String {
    let mut s = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, String)>| {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(s, "{name}{{{labels}}} {value}");
        }
    };
    let per_gpu = |f: &dyn Fn(&GpuReport) -> String| -> Vec<(String, String)> {
        r.gpus
            .iter()
            .map(|g| {
                (
                    format!("gpu=\"{}\",index=\"{}\"", label(&g.uuid), g.index),
                    f(g),
                )
            })
            .collect()
    };
    let per_job = |f: &dyn Fn(&JobRow) -> String| -> Vec<(String, String)> {
        r.gpus
            .iter()
            .flat_map(|g| {
                g.jobs.iter().map(move |j| {
                    (
                        format!("job=\"{}\",gpu=\"{}\"", label(&j.id), label(&g.uuid)),
                        f(j),
                    )
                })
            })
            .collect()
    };
    family(
        "cudaw_node_jobs",
        "gauge",
        "Jobs on the GPU.",
        per_gpu(&|g| g.jobs.len().to_string()),
    );
    family(
        "cudaw_node_unseen_bytes",
        "gauge",
        "Device memory on the GPU that is not cudaw's (contexts, other programs), as learnt from allocations that waited where the accounting said they fit.",
        per_gpu(&|g| g.unseen_bytes.to_string()),
    );
    family(
        "cudaw_node_gpu_share",
        "gauge",
        "The share of the GPU's time the job had over the last minute (0-1).",
        per_job(&|j| j.achieved_share.to_string()),
    );
    family(
        "cudaw_node_request",
        "gauge",
        "The job's guaranteed share of the GPU's time (0-1).",
        per_job(&|j| j.request.to_string()),
    );
    family(
        "cudaw_node_limit",
        "gauge",
        "The job's largest share of the GPU's time (0-1).",
        per_job(&|j| j.limit.to_string()),
    );
    family(
        "cudaw_node_running",
        "gauge",
        "1 while the job holds the GPU.",
        per_job(&|j| u8::from(j.running).to_string()),
    );
    family(
        "cudaw_node_resident_bytes",
        "gauge",
        "The job's device memory resident on the GPU.",
        per_job(&|j| j.resident_bytes.to_string()),
    );
    family(
        "cudaw_node_swapped_bytes",
        "gauge",
        "The job's device memory swapped out to host memory.",
        per_job(&|j| j.swapped_bytes.to_string()),
    );
    family(
        "cudaw_node_swaps_total",
        "counter",
        "Times the job was swapped out.",
        per_job(&|j| j.swaps.to_string()),
    );
    family(
        "cudaw_node_waits_total",
        "counter",
        "Times the job waited for the GPU.",
        per_job(&|j| j.waits.to_string()),
    );
    family(
        "cudaw_node_gpu_seconds_total",
        "counter",
        "The GPU time the job had, in seconds.",
        per_job(&|j| j.gpu_seconds.to_string()),
    );
    family(
        "cudaw_node_launches_total",
        "counter",
        "The job's kernel launches (its processes', on all their GPUs).",
        per_job(&|j| j.launches.to_string()),
    );
    family(
        "cudaw_node_swapped_out_bytes_total",
        "counter",
        "Bytes of the job's device memory swapped out, over all its swaps.",
        per_job(&|j| j.swapped_out_bytes.to_string()),
    );
    family(
        "cudaw_node_memory_waits_total",
        "counter",
        "Times the job waited for memory: it did not fit, and nothing could be swapped out for it.",
        per_job(&|j| j.memory_waits.to_string()),
    );
    let _ = writeln!(
        s,
        "# HELP cudaw_node_config_refused 1 while the configuration file is refused (the one loaded before is in force).\n# TYPE cudaw_node_config_refused gauge\ncudaw_node_config_refused {}",
        u8::from(r.config.error.is_some())
    );
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> NodeReport {
        NodeReport {
            host_room: Some(100 << 30),
            gpus: vec![GpuReport {
                index: 0,
                uuid: "GPU-5a1b".into(),
                capacity: Some(80 << 30),
                unseen_bytes: 3 << 29,
                jobs: vec![
                    JobRow {
                        id: "train-a".into(),
                        pids: vec![41, 42],
                        request: 0.25,
                        limit: 0.5,
                        memory: Some(8 << 30),
                        achieved_share: 0.24,
                        resident_bytes: 3 << 30,
                        swapped_bytes: 0,
                        swaps: 2,
                        waits: 17,
                        running: true,
                        ..JobRow::default()
                    },
                    JobRow {
                        id: "we\"ird\\".into(),
                        pids: vec![7],
                        limit: 1.0,
                        ..JobRow::default()
                    },
                ],
            }],
            config: ConfigReport {
                path: "/etc/cudaw/node.toml".into(),
                loaded: 1000,
                error: Some("line 3: request: 2 is not within 0-1".into()),
                gpus: Default::default(),
                jobs: Vec::new(),
                default_gpus: None,
            },
            processes: vec![ProcessRow {
                pid: 99,
                job: Some("pid-99".into()),
                gpus: vec![],
                note: Some("no device memory yet".into()),
            }],
            pid: 5,
            run_dirs: vec!["/run/cudaw".into()],
        }
    }

    #[test]
    fn the_json_has_the_documented_shape() {
        let r = sample();
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        let job = &v["gpus"][0]["jobs"][0];
        for k in [
            "id",
            "pids",
            "request",
            "limit",
            "memory",
            "achieved_share",
            "resident_bytes",
            "swapped_bytes",
            "swaps",
            "waits",
            "running",
        ] {
            assert!(job.get(k).is_some(), "{k} missing from {job}");
        }
        assert_eq!(v["gpus"][0]["index"], 0);
        assert_eq!(v["gpus"][0]["uuid"], "GPU-5a1b");
        assert_eq!(v["config"]["path"], "/etc/cudaw/node.toml");
        assert!(v["config"]["error"].as_str().unwrap().starts_with("line 3"));
        let back: NodeReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn the_table_shows_every_job() {
        let t = table(&sample(), 1012);
        assert!(
            t.starts_with("GPU 0 (GPU-5a1b, 80.0 GiB, 1.5 GiB not cudaw's): 2 jobs\n"),
            "{t}"
        );
        assert!(t.contains("  JOB"), "{t}");
        let row = t.lines().find(|l| l.contains("train-a")).unwrap();
        for cell in ["41,42", "0.25", "0.50", "0.24", "8.0 GiB", "3.0 GiB", "yes"] {
            assert!(row.contains(cell), "{cell} missing from {row:?}");
        }
        assert!(
            t.contains("not on a GPU yet: 99 (no device memory yet)"),
            "{t}"
        );
        assert!(
            t.contains("config /etc/cudaw/node.toml (loaded 12 s ago)"),
            "{t}"
        );
        assert!(t.contains("config refused: line 3: request"), "{t}");
        let empty = table(&NodeReport::default(), 0);
        assert!(empty.starts_with("no jobs: no process under cudaw holds device memory (found 0 processes in no run folder)"), "{empty}");
    }

    #[test]
    fn the_metrics_name_job_and_gpu() {
        let m = prometheus(&sample());
        assert!(m.contains("# TYPE cudaw_node_gpu_share gauge\n"), "{m}");
        assert!(
            m.contains("cudaw_node_gpu_share{job=\"train-a\",gpu=\"GPU-5a1b\"} 0.24\n"),
            "{m}"
        );
        assert!(
            m.contains("cudaw_node_request{job=\"train-a\",gpu=\"GPU-5a1b\"} 0.25\n"),
            "{m}"
        );
        assert!(
            m.contains("cudaw_node_resident_bytes{job=\"train-a\",gpu=\"GPU-5a1b\"} 3221225472\n"),
            "{m}"
        );
        assert!(
            m.contains("cudaw_node_swaps_total{job=\"train-a\",gpu=\"GPU-5a1b\"} 2\n"),
            "{m}"
        );
        assert!(
            m.contains("cudaw_node_waits_total{job=\"train-a\",gpu=\"GPU-5a1b\"} 17\n"),
            "{m}"
        );
        assert!(
            m.contains("cudaw_node_jobs{gpu=\"GPU-5a1b\",index=\"0\"} 2\n"),
            "{m}"
        );
        assert!(
            m.contains("cudaw_node_unseen_bytes{gpu=\"GPU-5a1b\",index=\"0\"} 1610612736\n"),
            "{m}"
        );
        assert!(
            m.contains("cudaw_node_running{job=\"we\\\"ird\\\\\",gpu=\"GPU-5a1b\"} 0\n"),
            "{m}"
        );
        assert!(m.ends_with("cudaw_node_config_refused 1\n"), "{m}");
    }

    #[test]
    fn sizes() {
        assert_eq!(bytes(12), "12 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(8 << 30), "8.0 GiB");
    }
}
