//! Checks the driver layer against whatever `libcuda.so.1` it loads (`CUDAW_LIBCUDA=PATH`
//! picks another, such as simgpu), then times evicting and restoring device memory through
//! the VMM backend against one plain pinned copy each way.
//!
//! ```text
//! vmm_check [--size 8G] [--chunk 2M] [--streams 4] [--json]
//! ```
//! Exit code 0 only if every check (and the timed round trip's verification) passed.

use std::error::Error;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use driver::{sys, Driver, DriverBackend, LibCuda, PhysicalHandle};
use vmm::Backend;

type Res<T> = Result<T, Box<dyn Error>>;

const CHILD_ENV: &str = "VMM_CHECK_CHILD";
const GIB: f64 = (1u64 << 30) as f64;

struct Options {
    size: u64,
    chunk: Option<u64>,
    streams: usize,
    json: bool,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        size: 8 << 30,
        chunk: None,
        streams: 4,
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--size" => o.size = vmm::parse_size(&value("--size")?).ok_or("bad --size")?,
            "--chunk" => o.chunk = Some(vmm::parse_size(&value("--chunk")?).ok_or("bad --chunk")?),
            "--streams" => o.streams = value("--streams")?.parse().map_err(|_| "bad --streams")?,
            "--json" => o.json = true,
            "-h" | "--help" => {
                return Err(
                    "usage: vmm_check [--size 8G] [--chunk 2M] [--streams 4] [--json]".into(),
                )
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.streams == 0 {
        return Err("--streams must be at least 1".into());
    }
    Ok(o)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

struct Checker {
    quiet: bool,
    passed: Vec<(String, bool, String)>,
}

impl Checker {
    fn run(&mut self, name: &str, f: impl FnOnce() -> Res<String>) {
        let (ok, note) = match f() {
            Ok(note) => (true, note),
            Err(e) => (false, e.to_string()),
        };
        if !self.quiet {
            println!(
                "[{}] {name}{}{note}",
                if ok { "PASS" } else { "FAIL" },
                if note.is_empty() { "" } else { ": " }
            );
        }
        self.passed.push((name.to_owned(), ok, note));
    }

    fn all_ok(&self) -> bool {
        self.passed.iter().all(|(_, ok, _)| *ok)
    }
}

fn ensure(cond: bool, what: &str) -> Res<()> {
    if cond {
        Ok(())
    } else {
        Err(what.into())
    }
}

/// The child role: map, unmap, touch from the host. Must die of SIGSEGV.
fn child_touch_unmapped() -> Res<()> {
    let cuda: Arc<dyn Driver> = Arc::new(LibCuda::open()?);
    let backend = DriverBackend::new(cuda, 0)?;
    let g = backend.granularity()?;
    let base = backend.reserve(2 * g, 0)?;
    let p = backend.create_physical(g)?;
    backend.map(base, g, p)?;
    backend.copy_from_host(base, &[1; 16])?;
    backend.unmap(base, g)?;
    println!("touching");
    // SAFETY: deliberately not: the range was just unmapped; this must fault.
    let v = unsafe { std::ptr::read_volatile(base as *const u8) };
    println!("survived, read {v}");
    Ok(())
}

fn checks(c: &mut Checker, cuda: &Arc<dyn Driver>, backend: &DriverBackend, simulated: bool) {
    let g = backend.granularity().unwrap_or(2 << 20);
    c.run("driver, device and attributes", || {
        let dev = backend.device();
        use sys::CUdevice_attribute as A;
        let attr = |a| cuda.device_attribute(dev, a);
        let vmm = attr(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?;
        ensure(vmm == 1, "VMM not supported")?;
        Ok(format!(
            "driver {}, {} devices, {:?}, cc {}.{}, {} SMs, {:.1} GiB, granularity {} KiB",
            cuda.driver_version()?,
            cuda.device_count()?,
            cuda.device_name(dev)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            cuda.device_total_mem(dev)? as f64 / GIB,
            g >> 10
        ))
    });

    c.run(
        "reserve, create, map, copy, unmap, re-map at the same address",
        || {
            let base = backend.reserve(8 * g, 0)?;
            let addr = base + 2 * g;
            let p = backend.create_physical(2 * g)?;
            backend.map(addr, 2 * g, p)?;
            let data = pattern((2 * g) as usize, 3);
            backend.copy_from_host(addr, &data)?;
            let mut back = vec![0u8; data.len()];
            backend.copy_to_host(&mut back, addr)?;
            ensure(back == data, "read back differs")?;
            // Double map over a mapped range must be refused.
            let q = backend.create_physical(2 * g)?;
            let double = backend.map(addr, 2 * g, q);
            ensure(double.is_err(), "double map accepted")?;
            backend.unmap(addr, 2 * g)?;
            backend.release_physical(p)?;
            let unmapped = cuda.memcpy_dtoh(&mut back[..16], addr);
            ensure(unmapped.is_err(), "copy from unmapped memory succeeded")?;
            backend.map(addr, 2 * g, q)?;
            let data2 = pattern((2 * g) as usize, 77);
            backend.copy_from_host(addr, &data2)?;
            backend.copy_to_host(&mut back, addr)?;
            ensure(back == data2, "read back after re-map differs")?;
            backend.unmap(addr, 2 * g)?;
            backend.release_physical(q)?;
            backend.free_reservation(base, 8 * g)?;
            Ok(format!(
                "double map -> {}, copy from unmapped -> {}",
                double.unwrap_err(),
                unmapped.unwrap_err().name
            ))
        },
    );

    c.run(
        "host touch of unmapped memory faults (child process)",
        || {
            if !simulated {
                return Ok("skipped: device memory is not host-addressable on this driver".into());
            }
            let out = Command::new(std::env::current_exe()?)
                .env(CHILD_ENV, "touch")
                .output()?;
            use std::os::unix::process::ExitStatusExt;
            let stdout = String::from_utf8_lossy(&out.stdout);
            ensure(stdout.contains("touching"), "child did not reach the touch")?;
            ensure(
                out.status.signal() == Some(11),
                &format!("child ended with {:?}", out.status),
            )?;
            Ok("child died of SIGSEGV".into())
        },
    );

    c.run("out of memory beyond the device's memory", || {
        let (_, total) = backend.memory_info()?;
        let size = total.div_ceil(g) * g + g;
        match backend.create_physical(size) {
            Ok(p) => {
                backend.release_physical(p)?;
                Err(format!("created {size} bytes on a {total}-byte device").into())
            }
            Err(e) if e.is_out_of_memory() => Ok(format!("{e}")),
            Err(e) => Err(format!("expected out of memory, got {e}").into()),
        }
    });

    c.run(
        "async copies on two streams, events, NULL-stream ordering",
        || {
            let len = 64 << 20;
            let (x, y) = (cuda.mem_alloc(len as u64)?, cuda.mem_alloc(len as u64)?);
            let pinned = cuda.mem_host_alloc(2 * len, 0)?;
            // SAFETY: `pinned` holds 2 * len bytes until freed below; only this check uses it.
            let host = unsafe { std::slice::from_raw_parts_mut(pinned, 2 * len) };
            host[..len].copy_from_slice(&pattern(len, 1));
            host[len..].copy_from_slice(&pattern(len, 2));
            let (s1, s2) = (cuda.stream_create(0)?, cuda.stream_create(0)?);
            let (start, end) = (cuda.event_create(0)?, cuda.event_create(0)?);
            cuda.event_record(start, s1)?;
            // SAFETY: the host buffer outlives the copies (synchronised before it is freed).
            unsafe {
                cuda.memcpy_htod_async(x, host.as_ptr(), len, s1)?;
                cuda.memcpy_htod_async(y, host.as_ptr().add(len), len, s2)?;
            }
            cuda.event_record(end, s1)?;
            let mut back = vec![0u8; len];
            // The NULL stream waits for both blocking streams.
            cuda.memcpy_dtoh(&mut back, y)?;
            ensure(back[..] == host[len..], "y differs")?;
            cuda.memcpy_dtoh(&mut back, x)?;
            ensure(back[..] == host[..len], "x differs")?;
            cuda.event_synchronize(end)?;
            ensure(
                cuda.event_query(end)?,
                "event not complete after synchronize",
            )?;
            let ms = cuda.event_elapsed_ms(start, end)?;
            cuda.memcpy_dtod_async(y, x, len, s2)?;
            // SAFETY: as above.
            unsafe { cuda.memcpy_dtoh_async(pinned.add(len), y, len, s2)? };
            cuda.stream_synchronize(s2)?;
            ensure(host[len..] == host[..len], "device-to-device copy differs")?;
            ensure(cuda.stream_query(s2)?, "stream busy after synchronize")?;
            for s in [s1, s2] {
                cuda.stream_destroy(s)?;
            }
            for e in [start, end] {
                cuda.event_destroy(e)?;
            }
            cuda.ctx_synchronize()?;
            // SAFETY: every copy using it has completed.
            unsafe { cuda.mem_free_host(pinned)? };
            cuda.mem_free(x)?;
            cuda.mem_free(y)?;
            Ok(format!("64 MiB upload timed by events: {ms:.3} ms"))
        },
    );

    c.run("cuMemAlloc, memset, device-to-device copy", || {
        let p = backend.alloc_linear(1000)?;
        let q = backend.alloc_linear(1000)?;
        cuda.memset_d8(p, 0x5A, 1000)?;
        cuda.memcpy_dtod(q, p, 1000)?;
        let mut back = vec![0u8; 1000];
        backend.copy_to_host(&mut back, q)?;
        ensure(back.iter().all(|&b| b == 0x5A), "memset/copy differs")?;
        backend.free_linear(p)?;
        backend.free_linear(q)?;
        Ok(String::new())
    });
}

struct Timing {
    copy_out_s: f64,
    evict_s: f64,
    restore_s: f64,
    copy_in_s: f64,
    plain_dtoh_s: f64,
    plain_htod_s: f64,
    chunks: usize,
    verified: bool,
}

fn timed_round_trip(cuda: &Arc<dyn Driver>, backend: &DriverBackend, o: &Options) -> Res<Timing> {
    let g = backend.granularity()?;
    let chunk = o.chunk.unwrap_or(g).div_ceil(g) * g;
    let size = o.size.div_ceil(chunk) * chunk;
    let n = (size / chunk) as usize;
    let base = backend.reserve(size, 0)?;
    let mut handles: Vec<PhysicalHandle> = Vec::with_capacity(n);
    for i in 0..n {
        let p = backend.create_physical(chunk)?;
        backend.map(base + i as u64 * chunk, chunk, p)?;
        handles.push(p);
    }
    for i in 0..n {
        cuda.memset_d8(base + i as u64 * chunk, (i * 7 + 1) as u8, chunk as usize)?;
    }
    // A distinctive first page, so the sample is not only memset values.
    let head = pattern(4096, 9);
    backend.copy_from_host(base, &head)?;
    cuda.ctx_synchronize()?;

    let host = cuda.mem_host_alloc(size as usize, 0)?;
    let streams = (0..o.streams)
        .map(|_| cuda.stream_create(driver::api::STREAM_NON_BLOCKING))
        .collect::<Result<Vec<_>, _>>()?;

    // Evict: copy every chunk out on several streams, then unmap and release.
    let t0 = Instant::now();
    for i in 0..n {
        let off = i as u64 * chunk;
        // SAFETY: `host` holds `size` bytes and outlives the copies (synchronised below).
        unsafe {
            cuda.memcpy_dtoh_async(
                host.add(off as usize),
                base + off,
                chunk as usize,
                streams[i % streams.len()],
            )?
        };
    }
    for &s in &streams {
        cuda.stream_synchronize(s)?;
    }
    let copy_out_s = t0.elapsed().as_secs_f64();
    for (i, p) in handles.drain(..).enumerate() {
        backend.unmap(base + i as u64 * chunk, chunk)?;
        backend.release_physical(p)?;
    }
    let evict_s = t0.elapsed().as_secs_f64();

    // Restore: re-create, re-map at the same addresses, copy in on several streams.
    let t1 = Instant::now();
    for i in 0..n {
        let p = backend.create_physical(chunk)?;
        backend.map(base + i as u64 * chunk, chunk, p)?;
        handles.push(p);
    }
    let t_copy_in = Instant::now();
    for i in 0..n {
        let off = i as u64 * chunk;
        // SAFETY: as above.
        unsafe {
            cuda.memcpy_htod_async(
                base + off,
                host.add(off as usize),
                chunk as usize,
                streams[i % streams.len()],
            )?
        };
    }
    for &s in &streams {
        cuda.stream_synchronize(s)?;
    }
    let copy_in_s = t_copy_in.elapsed().as_secs_f64();
    let restore_s = t1.elapsed().as_secs_f64();

    // Verify a sample: the first page, and three bytes of up to 64 chunks spread evenly.
    let mut verified = true;
    let mut page = vec![0u8; 4096];
    backend.copy_to_host(&mut page, base)?;
    verified &= page == head;
    let step = n.div_ceil(64).max(1);
    for i in (0..n).step_by(step) {
        for off in [4096u64.min(chunk - 1), chunk / 2, chunk - 1] {
            if i == 0 && off < 4096 {
                continue;
            }
            let mut b = [0u8; 1];
            backend.copy_to_host(&mut b, base + i as u64 * chunk + off)?;
            verified &= b[0] == (i * 7 + 1) as u8;
        }
    }

    // The baseline: one plain pinned copy of the whole size, each way.
    // SAFETY: `host` holds `size` bytes; these copies are synchronous.
    let dst = unsafe { std::slice::from_raw_parts_mut(host, size as usize) };
    let t2 = Instant::now();
    cuda.memcpy_dtoh(dst, base)?;
    let plain_dtoh_s = t2.elapsed().as_secs_f64();
    let t3 = Instant::now();
    cuda.memcpy_htod(base, dst)?;
    let plain_htod_s = t3.elapsed().as_secs_f64();

    for &s in &streams {
        cuda.stream_destroy(s)?;
    }
    for (i, p) in handles.into_iter().enumerate() {
        backend.unmap(base + i as u64 * chunk, chunk)?;
        backend.release_physical(p)?;
    }
    backend.free_reservation(base, size)?;
    // SAFETY: every copy using it has completed.
    unsafe { cuda.mem_free_host(host)? };
    Ok(Timing {
        copy_out_s,
        evict_s,
        restore_s,
        copy_in_s,
        plain_dtoh_s,
        plain_htod_s,
        chunks: n,
        verified,
    })
}

fn main() -> ExitCode {
    if std::env::var(CHILD_ENV).is_ok() {
        return match child_touch_unmapped() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("child: {e}");
                ExitCode::from(2)
            }
        };
    }
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let setup = || -> Res<(Arc<dyn Driver>, DriverBackend)> {
        let lib = LibCuda::open()?;
        if !o.json {
            println!("driver library: {}", lib.path());
        }
        let cuda: Arc<dyn Driver> = Arc::new(lib);
        let backend = DriverBackend::new(cuda.clone(), 0)?;
        Ok((cuda, backend))
    };
    let (cuda, backend) = match setup() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    let simulated = cuda
        .device_name(backend.device())
        .map(|n| n.starts_with("simgpu"))
        .unwrap_or(false);
    let mut c = Checker {
        quiet: o.json,
        passed: Vec::new(),
    };
    checks(&mut c, &cuda, &backend, simulated);
    let timing = timed_round_trip(&cuda, &backend, &o);
    let gibs = |s: f64, size: f64| size / GIB / s;
    let size = o.size as f64;
    let ok = c.all_ok() && timing.as_ref().is_ok_and(|t| t.verified);
    match &timing {
        Ok(t) if o.json => {
            let failed: Vec<_> = c
                .passed
                .iter()
                .filter(|(_, ok, _)| !ok)
                .map(|(n, _, e)| format!("{n:?}: {e:?}"))
                .collect();
            println!(
                "{{\"ok\":{ok},\"size_bytes\":{},\"chunks\":{},\"streams\":{},\"evict_copy_out_gibs\":{:.3},\"evict_total_gibs\":{:.3},\"restore_copy_in_gibs\":{:.3},\"restore_total_gibs\":{:.3},\"plain_dtoh_gibs\":{:.3},\"plain_htod_gibs\":{:.3},\"evict_s\":{:.4},\"restore_s\":{:.4},\"verified\":{},\"failed_checks\":[{}]}}",
                o.size, t.chunks, o.streams,
                gibs(t.copy_out_s, size), gibs(t.evict_s, size), gibs(t.copy_in_s, size), gibs(t.restore_s, size),
                gibs(t.plain_dtoh_s, size), gibs(t.plain_htod_s, size), t.evict_s, t.restore_s, t.verified,
                failed.join(",")
            );
        }
        Ok(t) => {
            println!();
            println!(
                "{:.2} GiB in {} chunks, {} streams",
                size / GIB,
                t.chunks,
                o.streams
            );
            println!("{:<44} {:>9} {:>9}", "", "seconds", "GiB/s");
            let row = |name: &str, s: f64| println!("{name:<44} {s:>9.4} {:>9.2}", gibs(s, size));
            row("evict: copy out (device -> pinned host)", t.copy_out_s);
            row("evict: total (copy out + unmap + release)", t.evict_s);
            row("restore: copy in (pinned host -> device)", t.copy_in_s);
            row("restore: total (create + map + copy in)", t.restore_s);
            row("plain cuMemcpyDtoH, one copy", t.plain_dtoh_s);
            row("plain cuMemcpyHtoD, one copy", t.plain_htod_s);
            println!(
                "restored sample verified: {}",
                if t.verified { "yes" } else { "NO" }
            );
        }
        Err(e) if o.json => println!("{{\"ok\":false,\"error\":{:?}}}", e.to_string()),
        Err(e) => println!("timed round trip failed: {e}"),
    }
    if !o.json {
        println!(
            "{}",
            if ok {
                "ALL CHECKS PASSED"
            } else {
                "SOME CHECKS FAILED"
            }
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
