//! Times evicting and restoring device memory through [`PinnedStaging`] with several
//! configurations, against whatever `libcuda.so.1` it loads (`CUDAW_LIBCUDA=PATH` picks
//! another, such as simgpu), and the host side alone (faulting and copying into fresh
//! pageable memory, freeing it), to choose the staging's defaults on a real machine.
//!
//! ```text
//! staging_bench [--size 8G] [--alloc 512M] [--configs 4/8M/16,8/4M/16/nohp/nopf] [--host] [--pageable]
//! ```
//! A configuration is `STREAMS/BUFFER/THREADS`, optionally followed by `/nohp` (no huge
//! page advice), `/nopf` (no prefault) or `/bN` (N buffers). Prints one line per run;
//! exit code 0 only if every restored sample matched.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use driver::{Driver, DriverBackend, LibCuda, PinnedStaging, StagingConfig};
use vmm::{Backend, Config, HostStaging, Staging, Vmm};

type Res<T> = Result<T, Box<dyn Error>>;
const GIB: f64 = (1u64 << 30) as f64;

struct Options {
    size: u64,
    alloc: u64,
    configs: Vec<StagingConfig>,
    host: bool,
    pageable: bool,
}

fn parse_config(text: &str) -> Result<StagingConfig, String> {
    let parts: Vec<&str> = text.split('/').collect();
    if parts.len() < 3 {
        return Err(format!(
            "{text:?}: expected STREAMS/BUFFER/THREADS[/nohp][/nopf][/bN]"
        ));
    }
    let num = |s: &str| {
        s.parse::<usize>()
            .map_err(|_| format!("{text:?}: bad number {s:?}"))
    };
    let buffer = vmm::parse_size(parts[1]).ok_or(format!("{text:?}: bad size {:?}", parts[1]))?;
    let mut c = StagingConfig::new(num(parts[0])?, buffer as usize, num(parts[2])?);
    for flag in &parts[3..] {
        match *flag {
            "nohp" => c.huge_pages = false,
            "nopf" => c.prefault = false,
            b if b.starts_with('b') => c.buffers = num(&b[1..])?.max(1),
            other => return Err(format!("{text:?}: unknown flag {other:?}")),
        }
    }
    Ok(c)
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        size: 8 << 30,
        alloc: 512 << 20,
        configs: Vec::new(),
        host: false,
        pageable: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--size" => o.size = vmm::parse_size(&value("--size")?).ok_or("bad --size")?,
            "--alloc" => o.alloc = vmm::parse_size(&value("--alloc")?).ok_or("bad --alloc")?,
            "--configs" => {
                for c in value("--configs")?.split(',') {
                    o.configs.push(parse_config(c)?);
                }
            }
            "--host" => o.host = true,
            "--pageable" => o.pageable = true,
            "-h" | "--help" => return Err("usage: staging_bench [--size 8G] [--alloc 512M] [--configs 4/8M/16,8/4M/16/nohp/nopf/b32] [--host] [--pageable]".into()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.configs.is_empty() {
        o.configs.push(StagingConfig::default());
    }
    if o.alloc == 0 || o.size == 0 {
        return Err("--size and --alloc must be positive".into());
    }
    Ok(o)
}

fn value_of(i: usize) -> u8 {
    (i * 7 + 1) as u8
}

/// One evict + restore of everything, timed. Returns (prepare s, evict s, restore s, ok).
fn one_run<S: Staging<DriverBackend>>(
    vmm: &Vmm<DriverBackend>,
    staging: &mut S,
    allocs: &[vmm::Allocation],
) -> Res<(f64, f64, bool)> {
    let t0 = Instant::now();
    vmm.evict_all(staging)?;
    let evict = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    vmm.restore_all(staging)?;
    let restore = t1.elapsed().as_secs_f64();
    let mut ok = true;
    for (i, a) in allocs.iter().enumerate() {
        for off in [0, a.size / 3, a.size - 1] {
            let mut b = [0u8; 1];
            vmm.backend().copy_to_host(&mut b, a.base + off)?;
            ok &= b[0] == value_of(i);
        }
    }
    Ok((evict, restore, ok))
}

/// Faults and copies `size` bytes into fresh pageable memory with `threads` threads, as
/// the staging's host side does, then again into the same (now present) memory, then frees
/// it. Returns GiB/s fresh, GiB/s warm, seconds to free.
fn host_side(size: u64, threads: usize, huge: bool) -> (f64, f64, f64) {
    let piece = 8usize << 20;
    let n = (size as usize).div_ceil(512 << 20);
    let mut dests: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let mut v: Vec<u8> = Vec::with_capacity(512 << 20);
            if huge {
                let p = v.as_mut_ptr() as usize;
                let start = p.next_multiple_of(2 << 20);
                let end = (p + (512 << 20)) / (2 << 20) * (2 << 20);
                // SAFETY: advice on whole pages of our own allocation; changes no bytes.
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE)
                };
            }
            v
        })
        .collect();
    let ptrs: Vec<usize> = dests.iter_mut().map(|v| v.as_mut_ptr() as usize).collect();
    let pieces_per = (512usize << 20) / piece;
    let total = n * pieces_per;
    let run = || {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let src = vec![0x5Au8; piece];
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= total {
                            break;
                        }
                        let dst = ptrs[k / pieces_per] + (k % pieces_per) * piece;
                        // SAFETY: each piece of each destination's capacity is written by
                        // one thread only.
                        unsafe {
                            std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, piece)
                        };
                    }
                });
            }
        });
        (n as u64 * (512 << 20)) as f64 / GIB / t.elapsed().as_secs_f64()
    };
    let fresh = run();
    let warm = run();
    for v in &mut dests {
        // SAFETY: every byte of the capacity was written above.
        unsafe { v.set_len(512 << 20) };
    }
    let t = Instant::now();
    drop(dests);
    (fresh, warm, t.elapsed().as_secs_f64())
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("SOME SAMPLES DIFFERED");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("staging_bench: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(o: &Options) -> Res<bool> {
    for f in ["enabled", "defrag"] {
        let p = format!("/sys/kernel/mm/transparent_hugepage/{f}");
        println!(
            "thp {f}: {}",
            std::fs::read_to_string(&p).unwrap_or_default().trim()
        );
    }
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("cpus available: {cpus}");
    if o.host {
        for (threads, huge) in [(1, true), (8, true), (16, true), (16, false)] {
            let (fresh, warm, free) = host_side(o.size, threads, huge);
            println!(
                "host {:.1} GiB, {threads:>2} threads, huge pages {huge:>5}: fresh {fresh:6.2} GiB/s, warm {warm:6.2} GiB/s, free {:.3} s",
                o.size as f64 / GIB,
                free
            );
        }
    }
    let cuda: Arc<dyn Driver> = Arc::new(LibCuda::open()?);
    let backend = DriverBackend::new(cuda.clone(), 0)?;
    let vmm = Vmm::new(backend, Config::mapped())?;
    let n = o.size.div_ceil(o.alloc) as usize;
    let mut allocs = Vec::with_capacity(n);
    for i in 0..n {
        let a = vmm.alloc(o.alloc, 0)?;
        vmm.backend().make_current()?;
        cuda.memset_d8(a.base, value_of(i), o.alloc as usize)?;
        allocs.push(a);
    }
    cuda.ctx_synchronize()?;
    let bytes = n as f64 * o.alloc as f64;
    println!(
        "{} allocations of {} MiB ({:.2} GiB)",
        n,
        o.alloc >> 20,
        bytes / GIB
    );
    let mut all_ok = true;
    if o.pageable {
        let (e, r, ok) = one_run(&vmm, &mut HostStaging, &allocs)?;
        all_ok &= ok;
        println!(
            "pageable (HostStaging): evict {e:.3} s {:6.2} GiB/s, restore {r:.3} s {:6.2} GiB/s, ok {ok}",
            bytes / GIB / e,
            bytes / GIB / r
        );
    }
    for c in &o.configs {
        let mut staging = PinnedStaging::new(*c);
        let t = Instant::now();
        staging.prepare(vmm.backend())?;
        let prep = t.elapsed().as_secs_f64();
        for rep in 0..2 {
            let (e, r, ok) = one_run(&vmm, &mut staging, &allocs)?;
            all_ok &= ok;
            println!(
                "staging {}s/{}K/{}t/{}b hp={} pf={} rep {rep}: pool {:.1} MiB in {:.1} ms; evict {e:.3} s {:6.2} GiB/s, restore {r:.3} s {:6.2} GiB/s, ok {ok}",
                c.streams,
                c.buffer_bytes >> 10,
                c.threads,
                c.buffers,
                c.huge_pages,
                c.prefault,
                c.pinned_bytes() as f64 / (1 << 20) as f64,
                prep * 1e3,
                bytes / GIB / e,
                bytes / GIB / r
            );
        }
        staging.release()?;
    }
    for a in &allocs {
        vmm.free(a.base)?;
    }
    Ok(all_ok)
}
