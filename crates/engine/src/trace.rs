//! What the runtime side of tracing records into the process's tracer
//! ([`cudaw_trace::Tracer`]) and reads out of it: launches with the allocations their
//! arguments point into (read through the kernels' parameter layouts, or at their learned
//! pointer sites), the driver layer's launches, the timeline written safely, the metrics,
//! and the summary at exit. The timing of the calls themselves (the shadow stack and its
//! thunks) stays in the library that carries the trampolines (`crates/cudart-shim`).

use crate::log;
use crate::registry::{self, FunctionRecord};
use cudaw_trace::{timeline::Event, Direction, LaunchShape, Mode, Stats, Tracer};
use driver::hooks::TraceLaunch;
use driver::selfcost::ticks;
use std::ffi::c_void;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The events the timeline's writer adds to the ring's (the calls the threads' buffers
/// hold), run under the ring's lock ([`Tracer::write_timeline_with`]).
pub type Pending = fn() -> Vec<Event>;

/// The kernel's id in the tracer (its mangled name interned once per registration).
fn kernel_id(t: &Tracer, rec: &FunctionRecord) -> u32 {
    *rec.trace_id.get_or_init(|| t.kernel_id(&rec.name))
}

/// The 8-byte words of a launch's arguments that may be pointers (with the parameter
/// each came from): those inside the span of the live allocations
/// ([`Tracer::memory_span`]). A `sampled` launch (and one whose kernel's sites are not
/// known) is scanned whole through the kernel's parameter layout, and the words it found
/// teach the kernel's [`fatbin::sites::PointerSites`]; any other reads only the words at
/// those sites (a few loads where a scan reads the whole parameter block, hundreds of bytes
/// for most of PyTorch's kernels). Returns the bytes read, with `timed` the tick at which
/// the layout (or the sites) was at hand (0: no words were read), and whether the sites
/// were read.
///
/// # Safety
/// `args` is null or the launch's argument array: one pointer per kernel parameter, each
/// null or pointing at that parameter's bytes.
unsafe fn pointer_words(
    t: &Tracer,
    rec: &FunctionRecord,
    args: *mut *mut c_void,
    out: &mut smallvec::SmallVec<[(u16, u64); 16]>,
    timed: bool,
    sampled: bool,
    sm: fn() -> u32,
) -> (u64, u64, bool) {
    let (lo, hi) = t.memory_span();
    if lo >= hi || args.is_null() {
        return (0, 0, false);
    }
    if !sampled {
        if let Some(sites) = rec.sites.try_lock().filter(|s| s.ready()) {
            let at = if timed { ticks() } else { 0 };
            let bytes = sites.read(
                (lo, hi),
                |s| {
                    // SAFETY: the launch passes one argument pointer per kernel parameter.
                    let base = unsafe { *args.add(s.param as usize) } as *const u8;
                    // SAFETY: a scan of this kernel found a whole word at `at` in this
                    // parameter's bytes, which the launch's argument points at.
                    (!base.is_null())
                        .then(|| unsafe { base.add(s.at as usize).cast::<u64>().read_unaligned() })
                },
                |param, v| out.push((param as u16, v)),
            );
            return (bytes, at, true);
        }
    }
    let Some(layout) = rec.layout(sm()) else {
        return (0, 0, false);
    };
    let at = if timed { ticks() } else { 0 };
    let mut hits = Vec::new();
    fatbin::sites::scan(
        layout,
        |p| {
            // SAFETY: the launch passes one argument pointer per kernel parameter.
            let base = unsafe { *args.add(p.ordinal as usize) } as *const u8;
            // SAFETY: `base` points at this parameter's `size` bytes (the launch's
            // contract).
            (!base.is_null()).then(|| unsafe { std::slice::from_raw_parts(base, p.size as usize) })
        },
        (lo, hi),
        &mut hits,
        |param, v| out.push((param as u16, v)),
    );
    rec.sites.lock().learn(&hits);
    // The bytes scanned, for CUDAW_TRACE_SELF's report only.
    let bytes = if timed {
        layout.params.iter().map(|p| u64::from(p.size)).sum()
    } else {
        0
    };
    (bytes, at, false)
}

/// The kernel the program registered under mangled name `name`, whose tracer id is `id`
/// (for the driver layer's sampled launches of the real runtime's kernels: one a sampled
/// launch). Found by name once per id, then kept by id: PyTorch's mangled names run to
/// hundreds of bytes, a hash each time. A record stays allocated when its fatbin is
/// unregistered, and a kernel's parameters follow from its mangled name, so a kept record
/// serves any later kernel of that name; it is kept only once its layout is parsed (while
/// its fatbin was registered).
pub fn named_record(id: u32, name: &str, sm: fn() -> u32) -> Option<&'static FunctionRecord> {
    static BY_ID: parking_lot::RwLock<Vec<Option<&'static FunctionRecord>>> =
        parking_lot::RwLock::new(Vec::new());
    if let Some(Some(rec)) = BY_ID.read().get(id as usize) {
        return Some(rec);
    }
    let rec = registry::function_named(name)?;
    rec.layout(sm())?;
    let mut by_id = BY_ID.write();
    if by_id.len() <= id as usize {
        by_id.resize(id as usize + 1, None);
    }
    by_id[id as usize] = Some(rec);
    Some(rec)
}

/// The words of a launch of `rec`'s kernel (arguments `args`) that may be pointers, read
/// through its parameter layout as a sampled launch's are ([`pointer_words`]): for a launch
/// cudaw's driver layer counted and sampled but cannot read ([`record_named_launch`]).
///
/// # Safety
/// As [`pointer_words`]'.
pub unsafe fn sampled_words(
    t: &Tracer,
    rec: &FunctionRecord,
    args: *mut *mut c_void,
    sm: fn() -> u32,
) -> smallvec::SmallVec<[(u16, u64); 16]> {
    let mut words = smallvec::SmallVec::new();
    // SAFETY: the caller's contract.
    unsafe { pointer_words(t, rec, args, &mut words, false, true, sm) };
    words
}

/// Records a launch of `rec`'s kernel that succeeded (name, grid, block, the allocations its
/// arguments `args` point into): `start` is the tick read before it (with the timeline),
/// `lookup_ticks` what finding `rec` took (`CUDAW_TRACE_SELF`), `sm` the device's SM
/// number for the kernel's parameter layout.
///
/// # Safety
/// As [`pointer_words`]'.
#[allow(clippy::too_many_arguments)]
pub unsafe fn record_launch(
    t: &Tracer,
    rec: Option<&FunctionRecord>,
    lookup_ticks: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: usize,
    args: *mut *mut c_void,
    sm: fn() -> u32,
    start: u64,
) {
    let timeline = t.timeline();
    let end = if timeline { t.now() } else { 0 };
    let Some(rec) = rec else { return };
    let timed = driver::selfcost::enabled();
    let t0 = if timed { ticks() } else { 0 };
    let k = kernel_id(t, rec);
    let weight = t.count_launch(k);
    let t1 = if timed { ticks() } else { 0 };
    let mut words = smallvec::SmallVec::new();
    // The words of one launch in CUDAW_TRACE_BUFFER_SAMPLE of each kernel go to the memory
    // history; the timeline keeps every launch's (resolved when it is read).
    let (bytes, tl, short) = if weight != 0 || timeline {
        // SAFETY: the caller's contract.
        unsafe { pointer_words(t, rec, args, &mut words, timed, weight != 0, sm) }
    } else {
        (0, 0, false)
    };
    let t2 = if timed { ticks() } else { 0 };
    let (start, end) = match (timeline, words.is_empty()) {
        (true, _) => (start, end),
        (false, true) => (0, 0),
        (false, false) => {
            let now = t.now();
            (now, now)
        }
    };
    let shape = LaunchShape {
        grid,
        block,
        shared: shared as u32,
    };
    // Counted already: without the timeline, a launch whose buffers are not looked up
    // has nothing more to record.
    if timeline || weight != 0 {
        t.record_counted_launch(k, shape, start, end, words.iter().copied(), weight);
    }
    if timed && SELF_COST.begin(t0) {
        SELF_COST.add(0, lookup_ticks);
        // Without words read, the whole span is the layout's.
        let tl = if tl == 0 { t2 } else { tl };
        SELF_COST.add(1, t1.saturating_sub(t0));
        SELF_COST.add(2, tl.saturating_sub(t1));
        SELF_COST.add(3, t2.saturating_sub(tl));
        SELF_COST.add(4, ticks().saturating_sub(t2));
        SELF_COST.end(words.len() as u64, bytes);
        SITE_READS.fetch_add(u64::from(short), Ordering::Relaxed);
    }
}

/// `CUDAW_TRACE_SELF=1`: of the launches timed, those whose words were read at their
/// kernels' learned pointer sites (the rest were scanned whole, or had none read).
static SITE_READS: AtomicU64 = AtomicU64::new(0);

/// `CUDAW_TRACE_SELF=1`: the phases of this layer's traced launches (summary at exit).
static SELF_COST: driver::selfcost::SelfCost = driver::selfcost::SelfCost::new(
    "runtime layer",
    [
        "record lookup",
        "kernel id",
        "layout",
        "argument words",
        "record",
    ],
    None,
);

/// `f()` and, with `CUDAW_TRACE_SELF=1` and tracing `on`, the ticks it took (else 0): a
/// launch wrapper times its record lookup with it.
#[inline]
pub fn self_timed<R>(on: bool, f: impl FnOnce() -> R) -> (R, u64) {
    if !(driver::selfcost::enabled() && on) {
        return (f(), 0);
    }
    let t0 = ticks();
    let r = f();
    (r, ticks().saturating_sub(t0))
}

/// Records launch `l`, which cudaw's driver layer made and read, counted (or counted now)
/// by `count`, which gives its weight.
pub fn record_driver_launch(t: &Tracer, l: &TraceLaunch, count: impl FnOnce(&Tracer, u32) -> u32) {
    if l.kernel == u32::MAX {
        return;
    }
    let weight = count(t, l.kernel);
    let words: &[driver::hooks::TraceWord] = if l.words.is_null() || l.words_len == 0 {
        &[]
    } else {
        // SAFETY: `words_len` words at `words`, owned by the driver shim for this call
        // (`TraceLaunch`'s contract).
        unsafe { std::slice::from_raw_parts(l.words, l.words_len) }
    };
    let shape = LaunchShape {
        grid: l.grid,
        block: l.block,
        shared: l.shared,
    };
    t.record_counted_launch(
        l.kernel,
        shape,
        l.start,
        l.end,
        words.iter().map(|w| (w.param, w.value)),
        weight,
    );
}

/// Records launch `l` of the kernel registered as `name` (arguments `params`), which cudaw's
/// driver layer counted and sampled but cannot read: read here through the kernel's
/// parameter layout. Whether it was recorded (the kernel is known).
///
/// # Safety
/// As [`pointer_words`]' for `params`.
pub unsafe fn record_named_launch(
    t: &Tracer,
    l: &TraceLaunch,
    name: &str,
    params: *mut *mut c_void,
    weight: u32,
    sm: fn() -> u32,
) -> bool {
    if l.kernel == u32::MAX {
        return false;
    }
    let Some(rec) = named_record(l.kernel, name, sm) else {
        return false;
    };
    // SAFETY: the caller's contract.
    let words = unsafe { sampled_words(t, rec, params, sm) };
    let now = if words.is_empty() { 0 } else { t.now() };
    let shape = LaunchShape {
        grid: l.grid,
        block: l.block,
        shared: l.shared,
    };
    t.record_counted_launch(l.kernel, shape, now, now, words.iter().copied(), weight);
    true
}

// ------------------------------------------------------------------ reading

/// The metrics and the `top` hottest and coldest allocations, or why not (also while
/// tracing is switched off: what was recorded).
pub fn stats(top: usize) -> Result<Stats, String> {
    match cudaw_trace::get() {
        Some(t) => {
            let mut s = t.stats(std::process::id(), top);
            fill_transfers(&mut s);
            Ok(s)
        }
        None => Err(format!(
            "tracing is off in process {} (start it with CUDAW_TRACE=metrics or CUDAW_TRACE=timeline)",
            std::process::id()
        )),
    }
}

/// The host transfers the engine counts itself: staged copies and smart pinning.
fn fill_transfers(s: &mut Stats) {
    let (copies, bytes) = crate::pageable::staged();
    s.transfers = cudaw_trace::report::TransferStat {
        staged_copies: copies,
        staged_bytes: bytes,
        ..Default::default()
    };
    if let Some(p) = crate::pinning::stats() {
        let t = &mut s.transfers;
        t.pinning = true;
        (t.hot_copies, t.hot_bytes, t.cold_copies, t.cold_bytes) =
            (p.hot_copies, p.hot_bytes, p.cold_copies, p.cold_bytes);
        (t.pinned_bytes, t.pinned_ranges, t.peak_pinned_bytes) =
            (p.pinned_bytes, p.pinned_ranges, p.peak_pinned_bytes);
        (t.released, t.refused) = (p.released, p.refused);
    }
}

/// What writing the timeline did.
pub struct Written {
    /// Events written.
    pub events: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Events dropped from the ring before.
    pub dropped: u64,
}

/// Writes the timeline so far to `path`, the safe way ([`cudaw_files::NewFile`]: a
/// temporary beside it, created exclusive, no-follow, mode 0600, under a random name,
/// synced and renamed into place; a `path` that is a link, a FIFO or a device is refused).
pub fn write_timeline(path: &Path, pending: Pending) -> Result<Written, String> {
    let t = timeline_tracer()?;
    let events = cudaw_files::write_file(path, |f| write_events(t, f, pending))
        .map_err(|e| format!("writing the timeline: {e}"))?;
    Ok(written(
        t,
        events,
        std::fs::symlink_metadata(path).map_or(0, |m| m.len()),
    ))
}

/// Writes the timeline so far into `file`, a file a client created and passed (it renames
/// it to `path` afterwards): from its start, replacing what it held, then synced.
pub fn write_timeline_into(file: &File, path: &Path, pending: Pending) -> Result<Written, String> {
    let t = timeline_tracer()?;
    let fail = |e: std::io::Error| format!("writing the timeline to {}: {e}", path.display());
    cudaw_files::check_input(file, path).map_err(|e| format!("writing the timeline: {e}"))?;
    file.set_len(0).map_err(fail)?;
    let mut f = file;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).map_err(fail)?;
    let events = write_events(t, file, pending).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    Ok(written(t, events, file.metadata().map_or(0, |m| m.len())))
}

fn timeline_tracer() -> Result<&'static Tracer, String> {
    let Some(t) = cudaw_trace::get() else {
        return Err(stats(0).err().unwrap_or_default());
    };
    if !t.timeline() {
        return Err(format!(
            "process {} keeps no timeline (CUDAW_TRACE=metrics; start it with CUDAW_TRACE=timeline)",
            std::process::id()
        ));
    }
    Ok(t)
}

fn write_events(t: &Tracer, f: &File, pending: Pending) -> std::io::Result<u64> {
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let n = t.write_timeline_with(
        &mut w,
        std::process::id(),
        &cudaw_trace::files::process_name(),
        pending,
    )?;
    std::io::Write::flush(&mut w)?;
    Ok(n)
}

fn written(t: &Tracer, events: u64, bytes: u64) -> Written {
    Written {
        events,
        bytes,
        dropped: t
            .stats(std::process::id(), 0)
            .timeline
            .map_or(0, |s| s.dropped),
    }
}

/// The summary at exit (with the timeline, written to `path` first): the counters' summary,
/// `CUDAW_TRACE_SELF`'s report, and the `rust_enters` calls timed on the slow path.
pub fn log_exit_summary(path: &Path, pending: Pending, rust_enters: u64) {
    let Some(t) = cudaw_trace::get() else { return };
    if t.timeline() {
        match write_timeline(path, pending) {
            Ok(w) => log::warn_plain(format_args!(
                "trace: timeline of {} events ({} dropped) written to {}",
                w.events,
                w.dropped,
                path.display()
            )),
            Err(e) => log::error(format_args!("trace: {e}")),
        }
    }
    let mut s = t.stats(std::process::id(), 5);
    fill_transfers(&mut s);
    for line in s.summary(10).lines() {
        log::warn_plain(format_args!("trace: {line}"));
    }
    if let Some(line) = SELF_COST.report(ticks()) {
        log::warn_plain(format_args!(
            "trace: {line}; {} read at their kernels' learned pointer sites",
            SITE_READS.load(Ordering::Relaxed)
        ));
    }
    log::warn_plain(format_args!(
        "trace: {rust_enters} calls timed on the Rust path (the rest on the fast path)"
    ));
}

/// The reply to a control request addressed to the tracer
/// ([`crate::host::Host::tracer_request`]): `switch` switches tracing on or off and says
/// whether it was on (or why it cannot), `pending` gives the calls the per-thread buffers
/// hold.
pub fn reply(
    req: crate::host::TracerRequest<'_>,
    switch: impl FnOnce(bool) -> Result<bool, String>,
    pending: Pending,
) -> cudaw_control::Reply {
    use crate::host::TracerRequest;
    use cudaw_control::{ErrorKind, Reply, TraceWritten, TracingSwitched};
    match req {
        TracerRequest::Stats { top } => match stats(top) {
            Ok(s) => Reply {
                ok: true,
                stats: Some(Box::new(s)),
                ..Reply::default()
            },
            Err(e) => Reply::error(ErrorKind::Failed, e),
        },
        TracerRequest::Switch { on } => match switch(on) {
            Ok(was_on) => Reply {
                ok: true,
                tracing: Some(TracingSwitched {
                    mode: crate::config::get().trace.as_str().to_owned(),
                    on,
                    was_on,
                }),
                ..Reply::default()
            },
            Err(e) => Reply::error(ErrorKind::Failed, e),
        },
        TracerRequest::Timeline { path, file } => {
            let written = match file {
                Some(f) => write_timeline_into(f, path, pending),
                None => write_timeline(path, pending),
            };
            match written {
                Ok(w) => Reply {
                    ok: true,
                    trace: Some(TraceWritten {
                        path: path.to_string_lossy().into_owned(),
                        events: w.events,
                        bytes: w.bytes,
                        dropped: w.dropped,
                    }),
                    ..Reply::default()
                },
                Err(e) => Reply::error(ErrorKind::Failed, e),
            }
        }
    }
}

// ------------------------------------------------------------------ the runtime side

/// Runs the copy `f` of `bytes` (`cudaMemcpyKind` `kind`) from `src` to `dst`, recording it
/// when it succeeds with `tracer` (none: tracing is off).
#[inline]
pub fn copy(
    tracer: Option<&Tracer>,
    kind: i32,
    bytes: usize,
    dst: *const c_void,
    src: *const c_void,
    f: impl FnOnce() -> u32,
) -> u32 {
    let Some(t) = tracer else { return f() };
    // The clock is read only where it is kept: the timeline's start, the last use.
    let timeline = t.timeline();
    let start = if timeline { t.now() } else { 0 };
    let rc = f();
    if rc == 0 {
        let end = t.now();
        let start = if timeline { start } else { end };
        t.record_copy(
            Direction::from_kind(kind),
            bytes as u64,
            dst as u64,
            src as u64,
            start,
            end,
        );
    }
    rc
}

/// Runs the launch `run` of `rec`'s kernel, recording it (name, grid, block, the
/// allocations its arguments point into) when it succeeds
/// ([`record_launch`]). `run` is told whether the timeline is on
/// (`None`: tracing is off) and returns the launch's result and whether cudaw's driver
/// layer recorded it already (then this layer does not); `sm` gives the device's SM number
/// for the kernel's parameter layout.
///
/// # Safety
/// `args` is the launch's argument array (the launch's contract).
#[inline]
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    tracer: Option<&Tracer>,
    rec: Option<&FunctionRecord>,
    lookup_ticks: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: usize,
    args: *mut *mut c_void,
    sm: fn() -> u32,
    run: impl FnOnce(Option<bool>) -> (u32, bool),
) -> u32 {
    let Some(t) = tracer else {
        return run(None).0;
    };
    // The clock is read only where it is kept: the timeline, and the last use of the
    // allocations the launch received (none for a kernel without pointers).
    let start = if t.timeline() { t.now() } else { 0 };
    let (rc, elsewhere) = run(Some(t.timeline()));
    if rc == 0 && !elsewhere {
        // SAFETY: `args` is the launch's argument array (the launch's contract, which
        // the real runtime relied on just now).
        unsafe { record_launch(t, rec, lookup_ticks, grid, block, shared, args, sm, start) };
    }
    rc
}

/// The launches cudaw's driver layer counted under `metrics` (it hands over only those whose
/// buffers the memory history looks up: `crates/driver-shim`'s `trace::launch`), by kernel,
/// to `each`; nothing without a driver layer of cudaw's.
pub fn driver_layer_launches(each: &mut dyn FnMut(&str, u64)) {
    type Export = extern "C" fn(driver::hooks::TracedLaunches, *mut c_void);
    extern "C" fn one(ctx: *mut c_void, name: *const u8, len: usize, n: u64) {
        crate::boundary::guard("reading the driver layer's launches", (), || {
            // SAFETY: `ctx` is the `&mut &mut dyn FnMut` passed below, alive for the call.
            let each = unsafe { &mut *(ctx as *mut &mut dyn FnMut(&str, u64)) };
            // SAFETY: the driver layer passes its kernel name's bytes, `len` of them.
            let bytes = unsafe { std::slice::from_raw_parts(name, len) };
            each(&String::from_utf8_lossy(bytes), n);
        })
    }
    // SAFETY: dlsym reads the loader's tables; RTLD_DEFAULT searches the global scope.
    let f = unsafe {
        libc::dlsym(
            libc::RTLD_DEFAULT,
            driver::hooks::TRACED_LAUNCHES_SYMBOL.as_ptr(),
        )
    };
    if f.is_null() {
        return;
    }
    // SAFETY: cudaw's driver layer exports this name with the signature `Export`.
    let f: Export = unsafe { std::mem::transmute(f) };
    let mut each = each;
    f(
        one,
        &mut each as *mut &mut dyn FnMut(&str, u64) as *mut c_void,
    );
}

/// The process's kernel launches so far, as cudaw's driver layer counts them
/// (`driver::hooks::TOTAL_LAUNCHES_SYMBOL`); 0 without it.
pub fn driver_launches() -> u64 {
    type Total = extern "C" fn() -> u64;
    // Found once the driver layer is loaded (the runtime loads it at its first call):
    // looked up again until then.
    static TOTAL: std::sync::OnceLock<Total> = std::sync::OnceLock::new();
    if let Some(f) = TOTAL.get() {
        return f();
    }
    // SAFETY: dlopen with RTLD_NOLOAD only looks the loaded library up (the runtime may
    // have loaded it RTLD_LOCAL: RTLD_DEFAULT would not see it); dlsym reads its table.
    // The handle is let go: the library stays loaded while the runtime holds it, for the
    // process's life (the driver is never unloaded).
    let p = unsafe {
        let h = libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        );
        if h.is_null() {
            return 0;
        }
        let p = libc::dlsym(h, driver::hooks::TOTAL_LAUNCHES_SYMBOL.as_ptr());
        libc::dlclose(h);
        p
    };
    if p.is_null() {
        return 0;
    }
    // SAFETY: cudaw's driver layer exports this name as `extern "C" fn() -> u64`.
    let f = unsafe { std::mem::transmute::<*mut c_void, Total>(p) };
    TOTAL.get_or_init(|| f)()
}

/// The mode cudaw's driver layer records in while tracing runs in `mode`: none with
/// `CUDAW_TRACE_DRIVER=off`.
pub fn driver_mode(mode: Mode) -> Mode {
    if crate::config::get().trace_driver {
        mode
    } else {
        Mode::Off
    }
}

/// Tells cudaw's driver layer (`libcuda.so.1`), when it is the loaded driver, to record or
/// not (`driver::hooks::TRACE_MODE_SYMBOL`) while tracing runs in `mode`.
pub fn driver_layer_mode(mode: Mode) {
    let mode = driver_mode(mode);
    // SAFETY: dlopen with RTLD_NOLOAD only looks the loaded library up; dlsym reads the
    // loader's tables. The driver layer exports the name as `extern "C" fn(u32)`; no other
    // library exports it.
    unsafe {
        let h = libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        );
        if h.is_null() {
            return;
        }
        let f = libc::dlsym(h, driver::hooks::TRACE_MODE_SYMBOL.as_ptr());
        if !f.is_null() {
            let set: extern "C" fn(u32) = std::mem::transmute(f);
            set(trace_mode_word(mode));
        }
        libc::dlclose(h);
    }
}

/// `mode` as the driver shim's word for it.
pub fn trace_mode_word(mode: Mode) -> u32 {
    use driver::hooks::{TRACE_METRICS, TRACE_OFF, TRACE_TIMELINE};
    match mode {
        Mode::Off => TRACE_OFF,
        Mode::Metrics => TRACE_METRICS,
        Mode::Timeline => TRACE_TIMELINE,
    }
}
