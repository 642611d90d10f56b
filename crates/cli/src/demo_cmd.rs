//! `cudaw demo`: runs an example CUDA program natively and under cudaw, and while it runs
//! under cudaw pauses it (its device memory handed back), resumes it, dumps it to an image
//! and restores it, showing each step with its timing and the device memory the program
//! holds; then checks that both runs printed the same result.
//!
//! Where it runs: on the GPU when `libcuda.so.1` loads and reports a device, else on
//! simgpu (cudaw's simulated device: `libsimgpu.so` in `../lib` beside this binary, or
//! beside it in a development build). The example is `tests/cuda/programs/cudaw_demo.cu`:
//! prebuilt in `../share/cudaw/cudaw_demo` by `scripts/package.sh`, or compiled here with
//! `nvcc` when one is found (its source is built into this binary).

use anyhow::{anyhow, bail, Context, Result};
use clap::Args as ClapArgs;
use cudaw_control::{Progress, Reply, Request, Status};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use crate::ckpt_client;
use crate::ckpt_progress::Bars;

/// The example's source, compiled with nvcc when no prebuilt copy is found.
const SOURCE: &str = include_str!("../../../tests/cuda/programs/cudaw_demo.cu");
const COMMON_H: &str = include_str!("../../../tests/cuda/programs/common.h");
/// nvcc's flags for the example: code for sm_80 and sm_90, and PTX for newer GPUs.
const NVCC_FLAGS: [&str; 6] = [
    "-cudart",
    "shared",
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=[sm_90,compute_90]",
];

/// `cudaw demo --help`'s text.
pub const LONG_ABOUT: &str = r#"Shows what cudaw does, on an example CUDA program.

The example (tests/cuda/programs/cudaw_demo.cu) fills a buffer of device memory and mixes
windows of it with a small kernel, then prints a checksum of all its device memory. The
demo runs it twice:

  1. natively, without cudaw, for the reference result;
  2. under cudaw (`cudaw run`), and while it runs:
     - pause    (what `kill -USR1 PID` or `cudaw-ckpt pause PID` does): its CUDA calls wait
                and its device memory is copied to host memory and handed back to the GPU;
     - resume   (`kill -USR2 PID`, `cudaw-ckpt resume PID`): the memory goes back at the
                same addresses and the program carries on, none the wiser;
     - dump     (`cudaw-ckpt dump PID -o FILE`): a checkpoint image of its device memory;
                the program stays paused, its memory only in the file;
     - restore  (`cudaw-ckpt restore PID -i FILE`): the image checked and loaded;
     then lets it finish, and compares its result with the native run's.

Each step shows its time and the device memory the program holds (cudaw-ckpt status).

Where: on the GPU when libcuda.so.1 loads and reports a device; otherwise on simgpu,
cudaw's simulated GPU (libsimgpu.so from dist/lib, or the development build's target/).
The example comes prebuilt in dist/share/cudaw (scripts/package.sh), or is compiled
with nvcc if one is found ($CUDAW_CUDA_BIN, target/cuda/bin, PATH, /usr/local/cuda/bin).

Exit status: 0 when the results match and the pause released the device memory; 1
otherwise (what failed is printed; with --json, {"ok":false,"error":...})."#;

/// Shows what cudaw does, on an example CUDA program.
#[derive(Debug, ClapArgs)]
#[command(
    after_help = "Examples:\n  cudaw demo                       on the GPU if there is one, else on simgpu\n  cudaw demo --device sim          on simgpu even with a GPU\n  cudaw demo --mib 4096            a 4 GiB example\n  cudaw demo --json                one JSON summary (scripts, gpu-check.sh)\n  cudaw demo --keep /tmp/d         keep the image, the logs and the compiled example"
)]
pub struct Args {
    #[arg(long, default_value = "auto", value_parser = crate::device::CHOICES, help = crate::device::HELP)]
    pub device: String,
    /// Device memory the example takes, in MiB (default: 1024 on a GPU, 64 on simgpu).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub mib: Option<u64>,
    /// Iterations the example runs.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=1_000_000))]
    pub iterations: u32,
    /// Addressing under cudaw: mapped (default) or translated.
    #[arg(long, value_parser = ["mapped", "translated"])]
    pub addressing: Option<String>,
    /// The example program to run (default: the prebuilt one, else compiled with nvcc).
    /// It must behave as cudaw_demo.cu does.
    #[arg(long, value_name = "PATH")]
    pub program: Option<PathBuf>,
    /// Keep the image, the logs and the compiled example in DIR (default: a temporary
    /// folder, removed at the end).
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// Print one JSON summary on standard output instead of the steps.
    #[arg(long)]
    pub json: bool,
}

/// Where the example runs.
struct Target {
    /// "gpu" or "simgpu".
    kind: &'static str,
    /// The device's name.
    name: String,
    /// Why simgpu, when it is.
    why: Option<String>,
    /// The real libcudart (or simgpu, which plays it).
    real_cudart: PathBuf,
    /// simgpu's library, on simgpu.
    simgpu: Option<PathBuf>,
}

/// The real CUDA 13 runtime on a GPU machine: $CUDAW_REAL_CUDART, else as `cudaw run`
/// finds it for the example.
fn find_real_cudart(program: &Path) -> Result<PathBuf> {
    let rpaths = crate::run_cmd::elf_needs(program)?
        .map(|(_, r)| r)
        .unwrap_or_default();
    crate::run_cmd::real_cudart(13, &rpaths).map_err(|looked| {
        anyhow!(
            "found a GPU but no CUDA 13 runtime (libcudart.so.13) to forward to ({looked}): \
             set CUDAW_REAL_CUDART=/path/to/libcudart.so.13, or run `cudaw demo --device sim`"
        )
    })
}

/// nvcc: $CUDAW_CUDA_BIN, the development tree's target/cuda/bin, PATH, /usr/local/cuda.
fn find_nvcc() -> Option<PathBuf> {
    let mut c: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("CUDAW_CUDA_BIN") {
        c.push(PathBuf::from(d).join("nvcc"));
    }
    c.extend(crate::device::beside_or_in_tree("../cuda/bin/nvcc"));
    if let Some(p) = std::env::var_os("PATH") {
        c.extend(std::env::split_paths(&p).map(|d| d.join("nvcc")));
    }
    c.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    c.into_iter()
        .find(|p| p.is_file())
        .and_then(|p| p.canonicalize().ok())
}

/// The example: --program, the prebuilt one, or compiled with nvcc into `cache`. Returns
/// it and how it was found.
fn find_program(args: &Args, cache: &Path) -> Result<(PathBuf, String)> {
    if let Some(p) = &args.program {
        if !p.is_file() {
            bail!("--program {}: no such file", p.display());
        }
        return Ok((p.canonicalize()?, "given".into()));
    }
    let mut prebuilt = crate::device::beside_or_in_tree("../share/cudaw/cudaw_demo");
    prebuilt.extend(crate::device::beside_or_in_tree("../demo/cudaw_demo"));
    if let Some(p) = prebuilt.iter().find(|p| p.is_file()) {
        return Ok((p.canonicalize()?, "prebuilt".into()));
    }
    let Some(nvcc) = find_nvcc() else {
        bail!(
            "no example program: {} missing and no nvcc found ($CUDAW_CUDA_BIN, \
             target/cuda/bin, PATH, /usr/local/cuda/bin). Run scripts/demo.sh (installs \
             nvcc into target/ and builds what the demo needs), use dist/ from \
             scripts/package.sh, or pass --program",
            crate::device::list(&prebuilt)
        );
    };
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    std::fs::write(cache.join("cudaw_demo.cu"), SOURCE)?;
    std::fs::write(cache.join("common.h"), COMMON_H)?;
    let exe = cache.join("cudaw_demo");
    let out = Command::new(&nvcc)
        .args(NVCC_FLAGS)
        .arg("-o")
        .arg(&exe)
        .arg(cache.join("cudaw_demo.cu"))
        .output()
        .with_context(|| format!("running {}", nvcc.display()))?;
    if !out.status.success() {
        bail!(
            "compiling the example with {} failed:\n{}{}",
            nvcc.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((exe, format!("compiled with {}", nvcc.display())))
}

fn mib(bytes: u64) -> String {
    if bytes == 0 {
        "0 bytes".to_owned()
    } else if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// What the demo prints: steps on a terminal or not, nothing with --json.
struct Out {
    json: bool,
    bars: bool,
}

impl Out {
    fn step(&self, n: usize, what: &str) -> Result<()> {
        if !self.json {
            outln!("\n[{n}/7] {what}")?;
        }
        Ok(())
    }

    fn line(&self, text: impl AsRef<str>) -> Result<()> {
        if !self.json {
            outln!("      {}", text.as_ref())?;
        }
        Ok(())
    }
}

/// The example running under cudaw.
struct Running {
    child: Child,
    pid: u32,
    socket: PathBuf,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Output lines other than "ran N".
    output: Vec<String>,
    done: u32,
    log: PathBuf,
}

impl Running {
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The next output line that is not "ran N" (None at the end), or the count of a
    /// "ran N" line.
    fn next_line(&mut self, timeout: Duration) -> Result<Option<String>> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(Some(l)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(anyhow!(
                "the example printed nothing for {} s; its log:\n{}",
                timeout.as_secs(),
                self.log_tail()
            )),
        }
    }

    fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the example's input is closed")?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("the example exited early; its log:\n{}", self.log_tail()))
    }

    /// Runs iterations until `upto` are done, drawing a bar.
    fn run_to(&mut self, upto: u32, total: u32, out: &Out) -> Result<f64> {
        let started = Instant::now();
        let bar = out.bars.then(|| {
            let b = ProgressBar::new(u64::from(total));
            b.set_style(
                ProgressStyle::with_template(&format!(
                    "      running [{{bar:{}}}] {{pos}}/{{len}} iterations {{per_sec}}",
                    crate::ckpt_progress::BAR_COLUMNS
                ))
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b.set_position(u64::from(self.done));
            b
        });
        let chunk = (total / 50).max(1);
        while self.done < upto {
            let k = chunk.min(upto - self.done);
            self.send(&format!("run {k}"))?;
            self.wait_ran()?;
            if let Some(b) = &bar {
                b.set_position(u64::from(self.done));
            }
        }
        if let Some(b) = bar {
            b.abandon();
            // Its line ends here (indicatif leaves the cursor on it).
            errln!();
        }
        Ok(started.elapsed().as_secs_f64())
    }

    /// Waits for one "ran N" line.
    fn wait_ran(&mut self) -> Result<()> {
        loop {
            let Some(l) = self.next_line(Duration::from_secs(120))? else {
                bail!(
                    "the example under cudaw ended early; its log:\n{}",
                    self.log_tail()
                );
            };
            if let Some(n) = l.strip_prefix("ran ") {
                self.done = n.trim().parse().unwrap_or(self.done);
                return Ok(());
            }
            self.output.push(l);
        }
    }

    /// One request on the socket, progress drawn.
    fn request(&self, req: &Request, out: &Out) -> Result<Reply> {
        let stream = UnixStream::connect(&self.socket)
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        let mut bars = Bars::new(out.json || !out.bars);
        let r = ckpt_client::exchange(stream, req, &mut |p: Progress| bars.update(p));
        bars.finish();
        r.map_err(|e| {
            anyhow!(
                "{} failed: {e}; the example's log:\n{}",
                req.name(),
                self.log_tail()
            )
        })
    }

    fn status(&self) -> Result<Status> {
        let quiet = Out {
            json: true,
            bars: false,
        };
        self.request(&Request::Status {}, &quiet)?
            .status
            .context("status: no status in the reply")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A failed demo leaves nothing behind (paused, the example would wait forever).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Device memory the process holds: bytes mapped on its devices, and bytes resident.
fn held(st: &Status) -> (u64, u64) {
    st.devices
        .iter()
        .fold((0, 0), |(m, r), d| (m + d.mapped, r + d.resident))
}

/// The checksum line of an output.
fn result_line(lines: &[String]) -> Option<String> {
    lines
        .iter()
        .rev()
        .find(|l| l.contains("checksum="))
        .cloned()
}

/// A folder for the demo's files: --keep, or a fresh temporary one removed on drop.
struct WorkDir {
    path: PathBuf,
    remove: bool,
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn work_dir(keep: Option<&Path>) -> Result<WorkDir> {
    use std::os::unix::fs::DirBuilderExt;
    let (path, remove) = match keep {
        Some(p) => (p.to_path_buf(), false),
        None => (
            std::env::temp_dir().join(format!("cudaw-demo-{}", std::process::id())),
            true,
        ),
    };
    let _ = std::fs::remove_dir_all(path.join("run"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path.join("run"))
        .with_context(|| format!("creating {}", path.display()))?;
    Ok(WorkDir {
        path: ckpt_client::absolute(&path)?,
        remove,
    })
}

/// Runs the demo. Under `--json` the summary goes to standard output, also when the
/// checks fail; any other failure is reported by `main` (`{"ok":false,"kind","error"}`).
pub fn run(args: &Args) -> Result<()> {
    let out = Out {
        json: args.json,
        bars: !args.json && std::io::stderr().is_terminal(),
    };
    let mut summary = demo(args, &out)?;
    let ok = summary["ok"] == true;
    if !ok {
        summary["kind"] = json!(crate::failure::Kind::Failed.as_str());
    }
    if args.json {
        outln!("{summary}")?;
    }
    if ok {
        return Ok(());
    }
    let e = anyhow!(
        "{}",
        summary["error"]
            .as_str()
            .unwrap_or("the demo's checks failed")
    );
    Err(if args.json {
        e.context(crate::failure::JsonPrinted)
    } else {
        e
    })
}

/// Where `cudaw` and `cudaw-ckpt` are, when PATH does not lead to this binary: for the
/// demo's last line.
fn not_on_path() -> Option<PathBuf> {
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .ok()?;
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("cudaw"))
            .find(|c| c.is_file())
            .and_then(|c| c.canonicalize().ok())
    });
    (on_path.as_ref() != Some(&me)).then(|| me.parent().map(Path::to_path_buf))?
}

fn demo(args: &Args, out: &Out) -> Result<Value> {
    let work = work_dir(args.keep.as_deref())?;
    let place = crate::device::choose(&args.device)?;
    let (program, found) = find_program(args, &work.path.join("example"))?;
    let target = match place {
        crate::device::Target::Gpu(name) => Target {
            kind: "gpu",
            name: name.unwrap_or_else(|| "the GPU".into()),
            why: None,
            real_cudart: find_real_cudart(&program)?,
            simgpu: None,
        },
        crate::device::Target::Sim { lib, why } => Target {
            kind: "simgpu",
            name: "simgpu (a simulated GPU)".into(),
            why: Some(why.unwrap_or_else(|| "--device sim".into())),
            real_cudart: lib.clone(),
            simgpu: Some(lib),
        },
    };
    let mib_n = args
        .mib
        .unwrap_or(if target.kind == "gpu" { 1024 } else { 64 });
    let iters = args.iterations;
    let prog_args = [mib_n.to_string(), iters.to_string()];

    if !out.json {
        outln!("cudaw demo: an example CUDA program, natively and under cudaw")?;
        outln!("      device   {}", target.name)?;
        if let Some(why) = &target.why {
            if why == "--device sim" {
                outln!("               (--device sim: simgpu even if there is a GPU)")?;
            } else {
                outln!("               (no GPU here: {why}; simgpu stands in for it)")?;
            }
        }
        outln!("      program  {} ({found})", program.display())?;
        outln!(
            "               {mib_n} MiB of device memory, {iters} iterations of a small kernel"
        )?;
        outln!("      runtime  {}", target.real_cudart.display())?;
    }

    // 1. Natively.
    out.step(1, "native run, without cudaw (the reference result)")?;
    let native = native_run(&program, &prog_args, &target, &work.path)?;
    out.line(format!(
        "{}  ({:.2} s)",
        native.0.as_deref().unwrap_or("?"),
        native.1
    ))?;

    // 2. Under cudaw, to 40 %.
    out.step(2, "the same program under cudaw (`cudaw run`), running")?;
    let started = Instant::now();
    let mut r = start_under_cudaw(args, &program, &prog_args, &target, &work.path)?;
    let first = started.elapsed().as_secs_f64();
    out.line(format!(
        "PID {}: started in {first:.2} s, control socket {}",
        r.pid,
        r.socket.display()
    ))?;
    let t = r.run_to(iters * 2 / 5, iters, out)?;
    let running = r.status()?;
    let (mapped_before, resident_before) = held(&running);
    out.line(format!(
        "{} of {iters} iterations in {t:.2} s; device memory held: {}",
        r.done,
        mib(mapped_before)
    ))?;

    // 3. Pause.
    out.step(
        3,
        "pause (what `kill -USR1 PID` and `cudaw-ckpt pause PID` do)",
    )?;
    let rep = r.request(
        &Request::Pause {
            progress: true,
            release_context: false,
            by: None,
        },
        out,
    )?;
    let paused = rep.pause.context("pause: no result")?;
    let st = r.status()?;
    let (mapped_paused, _) = held(&st);
    out.line(format!(
        "paused in {:.1} ms: {} allocations, {} copied to host memory",
        paused.ms,
        paused.allocations,
        mib(paused.bytes)
    ))?;
    out.line(format!(
        "device memory held: {} -> {}   (state: {})",
        mib(mapped_before),
        mib(mapped_paused),
        st.state.as_str()
    ))?;
    // The program is frozen: ask it for an iteration; nothing comes while paused.
    r.send("run 1")?;
    let early = r.lines.recv_timeout(Duration::from_millis(300)).ok();
    let frozen = early.is_none();
    if let Some(l) = &early {
        if let Some(n) = l.strip_prefix("ran ") {
            r.done = n.trim().parse().unwrap_or(r.done);
        }
    }
    out.line(if frozen {
        "the program is held: asked for one more iteration, it did nothing for 300 ms"
    } else {
        "the program made progress while paused (it should not have)"
    })?;

    // 4. Resume.
    out.step(4, "resume (`kill -USR2 PID`, `cudaw-ckpt resume PID`)")?;
    let rep = r.request(
        &Request::Resume {
            progress: true,
            context_restored: false,
        },
        out,
    )?;
    let resumed = rep.resume.context("resume: no result")?;
    if frozen {
        r.wait_ran()?;
    }
    let st = r.status()?;
    let (mapped_resumed, _) = held(&st);
    out.line(format!(
        "resumed in {:.1} ms: {} back at the same addresses; device memory held: {}",
        resumed.ms,
        mib(resumed.bytes),
        mib(mapped_resumed)
    ))?;
    let t = r.run_to(iters * 7 / 10, iters, out)?;
    out.line(format!("{} of {iters} iterations ({t:.2} s more)", r.done))?;

    // 5. Dump.
    out.step(5, "dump a checkpoint (`cudaw-ckpt dump PID -o FILE`)")?;
    let image = work.path.join("demo.img");
    let image_s = ckpt_client::utf8(&image)?;
    let rep = r.request(
        &Request::Dump {
            path: image_s.clone(),
            leave_running: false,
            keep_shared: false,
            fd: false,
            progress: true,
        },
        out,
    )?;
    let dumped = rep.dump.context("dump: no result")?;
    let st = r.status()?;
    let (mapped_dumped, _) = held(&st);
    let in_file: u64 = st.devices.iter().map(|d| d.in_file).sum();
    out.line(format!(
        "{} in {} ({} on disk) in {:.1} ms; the program stays paused",
        mib(dumped.bytes),
        image.display(),
        mib(dumped.image_bytes),
        dumped.ms
    ))?;
    out.line(format!(
        "device memory held: {}; in the image only: {}",
        mib(mapped_dumped),
        mib(in_file)
    ))?;

    // 6. Restore.
    out.step(6, "restore it (`cudaw-ckpt restore PID -i FILE`)")?;
    let rep = r.request(
        &Request::Restore {
            path: image_s,
            force: false,
            fd: false,
            progress: true,
        },
        out,
    )?;
    let restored = rep.restore.context("restore: no result")?;
    let st = r.status()?;
    let (mapped_restored, _) = held(&st);
    out.line(format!(
        "checked in {:.1} ms, {} loaded in {:.1} ms; running again; device memory held: {}",
        restored.verify_ms,
        mib(restored.bytes),
        restored.load_ms,
        mib(mapped_restored)
    ))?;

    // 7. Finish.
    out.step(7, "let it finish, and compare with the native run")?;
    r.run_to(iters, iters, out)?;
    r.send("end")?;
    drop(r.stdin.take());
    while let Some(l) = r.next_line(Duration::from_secs(600))? {
        if !l.starts_with("ran ") {
            r.output.push(l);
        }
    }
    let status = r.child.wait()?;
    let total = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!(
            "the example under cudaw failed ({status}); its log:\n{}",
            r.log_tail()
        );
    }
    let under = result_line(&r.output);
    let same = under.is_some() && under == native.0;
    let released = mapped_before > 0 && mapped_paused == 0 && mapped_dumped == 0;
    out.line(format!(
        "native:      {}",
        native.0.as_deref().unwrap_or("?")
    ))?;
    out.line(format!(
        "under cudaw: {}  ({total:.2} s with the steps above)",
        under.as_deref().unwrap_or("?")
    ))?;
    let mut error = None;
    if !frozen {
        error = Some("the example made progress while paused".to_owned());
    } else if !same {
        error = Some("the result under cudaw differs from the native run's".to_owned());
    } else if !released {
        error = Some(format!(
            "the pause did not release the device memory ({} held while paused)",
            mib(mapped_paused.max(mapped_dumped))
        ));
    }
    if !out.json {
        match &error {
            None => {
                outln!(
                    "\nPASS: the same result, and {} of device memory handed back while paused.\n\
                     Next: `cudaw run -- ./your_program` (on simgpu when there is no GPU), then \
                     `cudaw-ckpt status` and `cudaw-ckpt pause PID` (see `cudaw --help`, \
                     `cudaw-ckpt --help`).",
                    mib(mapped_before)
                )?;
                if let Some(dir) = not_on_path() {
                    outln!(
                        "cudaw and cudaw-ckpt are in {0}, which is not on your PATH: call them \
                         as {0}/cudaw, or `export PATH={0}:$PATH`.",
                        dir.display()
                    )?;
                }
            }
            Some(e) => outln!("\nFAIL: {e}")?,
        }
    }
    let moved = |m: &cudaw_control::Moved| json!({"allocations": m.allocations, "bytes": m.bytes, "ms": m.ms});
    Ok(json!({
        "ok": error.is_none(),
        "error": error,
        "device": {"kind": target.kind, "name": target.name, "why_simgpu": target.why},
        "program": {"path": program, "found": found, "mib": mib_n, "iterations": iters},
        "real_cudart": target.real_cudart,
        "addressing": running.addressing,
        "native": {"result": native.0, "seconds": native.1},
        "cudaw": {"result": under, "seconds": total, "pid": r.pid},
        "device_bytes": {
            "running": mapped_before,
            "resident_running": resident_before,
            "paused": mapped_paused,
            "resumed": mapped_resumed,
            "dumped": mapped_dumped,
            "restored": mapped_restored,
        },
        "held_while_paused": frozen,
        "pause": moved(&paused),
        "resume": moved(&resumed),
        "dump": {"path": image, "bytes": dumped.bytes, "image_bytes": dumped.image_bytes,
                 "write_ms": dumped.write_ms, "ms": dumped.ms},
        "restore": {"bytes": restored.bytes, "verify_ms": restored.verify_ms,
                    "load_ms": restored.load_ms, "ms": restored.ms},
        "results_match": same,
        "memory_released": released,
    }))
}

/// Runs the example without cudaw: its result line and the time it took.
fn native_run(
    program: &Path,
    prog_args: &[String],
    target: &Target,
    work: &Path,
) -> Result<(Option<String>, f64)> {
    let mut cmd = Command::new(program);
    cmd.args(prog_args)
        .stdin(Stdio::null())
        .env_remove("LD_PRELOAD");
    // The program links libcudart.so.13: give the dynamic linker the real one's folder
    // (on simgpu, a folder where libcudart.so.13 is simgpu).
    let lib_dir = match &target.simgpu {
        Some(sim) => {
            let d = work.join("native-lib");
            std::fs::create_dir_all(&d)?;
            let link = d.join("libcudart.so.13");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(sim, &link)?;
            d
        }
        None => target
            .real_cudart
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    let mut ld = std::ffi::OsString::from(&lib_dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    cmd.env("LD_LIBRARY_PATH", ld);
    let started = Instant::now();
    let o = cmd
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    let secs = started.elapsed().as_secs_f64();
    if !o.status.success() {
        bail!(
            "the example failed without cudaw ({}):\n{}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    Ok((result_line(&lines), secs))
}

fn start_under_cudaw(
    args: &Args,
    program: &Path,
    prog_args: &[String],
    target: &Target,
    work: &Path,
) -> Result<Running> {
    let run_dir = work.join("run");
    let log = work.join("cudaw.log");
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("run").arg("--real-cudart").arg(&target.real_cudart);
    if let Some(a) = &args.addressing {
        cmd.args(["--addressing", a]);
    }
    cmd.arg("--")
        .arg(program)
        .args(prog_args)
        .env("CUDAW_RUN_DIR", &run_dir)
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file);
    if std::env::var_os("CUDAW_LOG").is_none() {
        cmd.env("CUDAW_LOG", "info");
    }
    if let Some(sim) = &target.simgpu {
        cmd.env("CUDAW_LIBCUDA", sim);
    }
    let mut child = cmd.spawn().context("starting `cudaw run`")?;
    let pid = child.id();
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().context("the example's output")?;
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut r = Running {
        child,
        pid,
        socket: cudaw_control::socket_path(&run_dir, pid),
        stdin,
        lines,
        output: Vec::new(),
        done: 0,
        log,
    };
    let first = r.next_line(Duration::from_secs(120))?.ok_or_else(|| {
        anyhow!(
            "the example under cudaw ended before starting; its log:\n{}",
            r.log_tail()
        )
    })?;
    r.output.push(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !r.socket.exists() {
        if Instant::now() > deadline {
            bail!(
                "the example runs but serves no control socket {}; its log:\n{}",
                r.socket.display(),
                r.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(r)
}
