//! Times evicting and restoring device memory through [`PinnedStaging`] with several
//! configurations, against whatever `libcuda.so.1` it loads (`CUDAW_LIBCUDA=PATH` picks
//! another, such as simgpu), and the host side alone (faulting and copying into fresh
//! pageable memory, freeing it), to choose the staging's defaults on a real machine. Each
//! configuration runs three times: the first evicts into fresh pages, the next two into the
//! host copies the previous restore kept (a default-mode pause's steady state).
//!
//! ```text
//! staging_bench [--size 8G] [--alloc 512M] [--configs 4/8M/16,8/4M/16/nohp/nopf] [--host] [--pageable] [--register]
//! ```
//! A configuration is `STREAMS/BUFFER/THREADS`, optionally followed by `/nohp` (no huge
//! page advice), `/nopf` (no prefault), `/nt` or `/nont` (streaming stores or not), `/hostalloc` (pool from
//! cuMemHostAlloc) or `/bN` (N buffers). Prints one line per run;
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
    register: bool,
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
            "nt" => c.streaming_stores = true,
            "nont" => c.streaming_stores = false,
            "hostalloc" => c.pin_in_place = false,
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
        register: false,
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
            "--register" => o.register = true,
            "-h" | "--help" => return Err("usage: staging_bench [--size 8G] [--alloc 512M] [--configs 4/8M/16,8/4M/16/nohp/nopf/b32] [--host] [--pageable] [--register]".into()),
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

/// A staging that times the calls of another: what the VMM adds is the rest.
struct Timed<'a, S> {
    inner: &'a mut S,
    save_s: f64,
    load_s: f64,
}

impl<S: Staging<DriverBackend>> Staging<DriverBackend> for Timed<'_, S> {
    fn save(
        &mut self,
        b: &DriverBackend,
        r: &[vmm::StagingRange],
    ) -> Result<Vec<vmm::HostCopy>, vmm::StagingError> {
        let t = Instant::now();
        let x = self.inner.save(b, r);
        self.save_s += t.elapsed().as_secs_f64();
        x
    }

    fn load(
        &mut self,
        b: &DriverBackend,
        r: &[vmm::LoadRange<'_>],
    ) -> Result<(), vmm::StagingError> {
        let t = Instant::now();
        let x = self.inner.load(b, r);
        self.load_s += t.elapsed().as_secs_f64();
        x
    }

    // The host copies a restore loaded go back to the staging, as a resume of cudaw's does
    // (CUDAW_HOST_REUSE): the next evict writes into memory already faulted in.
    fn recycle(&mut self, copies: Vec<Vec<u8>>) {
        self.inner.recycle(copies);
    }
}

/// Fresh host memory pinned in place (`cuMemHostRegister`) instead of copied through a
/// pool: populating it on 16 threads, registering it, copying straight into and out of
/// it, unregistering it, each timed.
fn register_experiment(
    cuda: &Arc<dyn Driver>,
    context: driver::Context,
    allocs: &[vmm::Allocation],
) -> Res<()> {
    let len = allocs[0].size as usize;
    let total = (len * allocs.len()) as f64 / GIB;
    let mut dests: Vec<Vec<u8>> = allocs.iter().map(|_| Vec::with_capacity(len)).collect();
    let ptrs: Vec<usize> = dests.iter_mut().map(|v| v.as_mut_ptr() as usize).collect();
    for &p in &ptrs {
        let start = p.next_multiple_of(2 << 20);
        let end = (p + len) / (2 << 20) * (2 << 20);
        // SAFETY: advice on whole pages of our own allocations; changes no bytes.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    let piece = 8usize << 20;
    let per = len.div_ceil(piece);
    let parallel = |threads: usize, f: &(dyn Fn(usize, usize) -> Res<()> + Sync)| -> Res<f64> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::Mutex::new(None::<String>);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= ptrs.len() * per {
                        break;
                    }
                    if let Err(e) = f(k / per, k % per) {
                        *failed.lock().unwrap() = Some(e.to_string());
                        break;
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap() {
            return Err(e.into());
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let populate = parallel(16, &|i, j| {
        let start = (ptrs[i] + j * piece).next_multiple_of(4096);
        let end = ((ptrs[i] + ((j + 1) * piece).min(len)) / 4096) * 4096;
        // SAFETY: whole pages of our own allocation; populating changes no bytes.
        let rc = unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            return Err(format!("madvise: {}", std::io::Error::last_os_error()).into());
        }
        Ok(())
    })?;
    println!(
        "register: populate {total:.1} GiB on 16 threads: {populate:.3} s {:6.2} GiB/s",
        total / populate
    );
    // Register: whole allocations from one thread, then 8 MiB pieces from 16 threads.
    let t = Instant::now();
    for &p in &ptrs[..ptrs.len() / 2] {
        // SAFETY: our own populated allocation, unregistered below before it is freed.
        unsafe { cuda.mem_host_register(p as *mut u8, len, 1)? };
    }
    let whole = t.elapsed().as_secs_f64();
    let half = total / 2.0;
    println!("register: cuMemHostRegister {half:.1} GiB as {} x {} MiB on 1 thread: {whole:.3} s {:6.2} GiB/s", ptrs.len() / 2, len >> 20, half / whole);
    let second = &ptrs[ptrs.len() / 2..];
    let pieces_s = {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let t = Instant::now();
        let n = second.len() * per;
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    let _ = cuda.ctx_set_current(context);
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= n {
                            break;
                        }
                        let p = second[k / per] + (k % per) * piece;
                        // SAFETY: as above; pieces are disjoint.
                        if let Err(e) = unsafe { cuda.mem_host_register(p as *mut u8, piece, 1) } {
                            println!("register piece failed: {e}");
                            break;
                        }
                    }
                });
            }
        });
        t.elapsed().as_secs_f64()
    };
    println!("register: cuMemHostRegister {half:.1} GiB as 8 MiB pieces on 16 threads: {pieces_s:.3} s {:6.2} GiB/s", half / pieces_s);
    // Copies straight between the device and registered memory, 4 streams, 8 MiB pieces.
    let streams: Vec<_> = (0..4)
        .map(|_| cuda.stream_create(1))
        .collect::<Result<_, _>>()?;
    for dir in ["dtoh", "htod"] {
        let t = Instant::now();
        let mut k = 0;
        for (i, a) in allocs.iter().enumerate() {
            for j in 0..per {
                let off = j * piece;
                let n = piece.min(len - off);
                let h = (ptrs[i] + off) as *mut u8;
                // SAFETY: registered host memory we own, synchronised below.
                unsafe {
                    if dir == "dtoh" {
                        cuda.memcpy_dtoh_async(h, a.base + off as u64, n, streams[k % 4])?;
                    } else {
                        cuda.memcpy_htod_async(a.base + off as u64, h, n, streams[k % 4])?;
                    }
                }
                k += 1;
            }
        }
        for &st in &streams {
            cuda.stream_synchronize(st)?;
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "register: {dir} into registered memory: {s:.3} s {:6.2} GiB/s",
            total / s
        );
    }
    let t = Instant::now();
    for &p in &ptrs[..ptrs.len() / 2] {
        // SAFETY: registered above; no copy uses it any more.
        unsafe { cuda.mem_host_unregister(p as *mut u8)? };
    }
    for &p in second {
        for j in 0..per {
            // SAFETY: as above.
            unsafe { cuda.mem_host_unregister((p + j * piece) as *mut u8)? };
        }
    }
    let un = t.elapsed().as_secs_f64();
    println!(
        "register: cuMemHostUnregister {total:.1} GiB: {un:.3} s {:6.2} GiB/s",
        total / un
    );
    for st in streams {
        cuda.stream_destroy(st)?;
    }
    for v in &mut dests {
        // SAFETY: populated (zeroed) or copied into above.
        unsafe { v.set_len(len) };
    }
    Ok(())
}

/// One evict + restore of everything, timed. Returns (evict s, restore s, ok).
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
    if o.register {
        if let Err(e) = register_experiment(&cuda, vmm.backend().context(), &allocs) {
            println!("register experiment failed: {e}");
        }
    }
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
        // Rep 0 evicts into fresh pages; reps 1 and 2 into the host copies rep 0's restore
        // kept (with the default CUDAW_HOST_REUSE): a default-mode pause's steady state.
        for rep in 0..3 {
            let mut timed = Timed {
                inner: &mut staging,
                save_s: 0.0,
                load_s: 0.0,
            };
            let (e, r, ok) = one_run(&vmm, &mut timed, &allocs)?;
            println!(
                "   staging alone: save {:.3} s {:6.2} GiB/s, load {:.3} s {:6.2} GiB/s",
                timed.save_s,
                bytes / GIB / timed.save_s,
                timed.load_s,
                bytes / GIB / timed.load_s
            );
            all_ok &= ok;
            println!(
                "staging {}s/{}K/{}t/{}b hp={} pf={} nt={} pin-in-place={} rep {rep}: pool {:.1} MiB in {:.1} ms; evict {e:.3} s {:6.2} GiB/s, restore {r:.3} s {:6.2} GiB/s, ok {ok}",
                c.streams,
                c.buffer_bytes >> 10,
                c.threads,
                c.buffers,
                c.huge_pages,
                c.prefault,
                c.streaming_stores,
                c.pin_in_place,
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
