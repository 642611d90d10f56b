//! Dump and restore: the process writes its own checkpoint image, and checks and loads one.
//!
//! **Dump** (`cudaw-ckpt dump`): pause if running ([`evict::pause`]), then stream every
//! allocation, in creation order, into a [`ckpt::ImageWriter`] (8 MiB chunks, xxh3) over a
//! [`cudaw_files::Streamed`] file (each piece written as given, no copy; the writeback to
//! the disk started every 32 MiB, so the final fsync waits for the last window only): from
//! the host copies the VMM holds ([`vmm::Vmm::with_host_copy`], no second copy) or, for
//! bytes a previous dump left in an image, from that image one chunk at a time. The image is
//! written to a temporary file beside `path` ([`cudaw_files::NewFile`]: exclusive,
//! no-follow, mode 0600, a random name), synced and renamed into place, so a failed dump
//! never leaves a partial image under the name asked for, and a `path` that is a link, a
//! FIFO or a device node is refused, never replaced. When `cudaw-ckpt` passed the file
//! itself (created beside `path` by the client, as the requesting user), the image is
//! written into it and the client renames it. Then either resume
//! (`--leave-running`), or mark every allocation as held in the image
//! ([`vmm::Vmm::mark_in_file`]), which frees the host copies: a later resume reads the
//! image. A failed dump leaves the process as it was (a pause it began with is undone).
//!
//! **Restore** (`cudaw-ckpt restore`): open the image — the one the client passed, or
//! `path` opened without following a link or blocking, a regular file only — (format,
//! checksums of header and metadata, table, length), pause if running, compare its
//! allocation table with the process's (ids, addresses, sizes, creation order), its
//! addressing mode and its producer (this PID on this host, unless forced): all before
//! touching anything, none of it reading the data. Then read the image **once**: every
//! allocation of every device, then every driver-handle range, is loaded into new device
//! memory, each chunk checked (xxh3) as it is read ([`ckpt::ImageReader::begin_load`]),
//! while the process's own copies stay where they are; then every device is synchronised
//! and the image digest checked over the chunk checksums the load saw
//! ([`ckpt::ImageReader::finish_load`], no second read); only then is the load committed
//! (which cannot fail) and the process resumed. A refused or failed restore — a mismatch,
//! a corrupt chunk, a file cut short or an I/O error mid-load, a digest mismatch, a device
//! failure — leaves the process as it was: the load is rolled back (the new memory
//! released), a paused process stays paused with its memory where it was (host copies,
//! the host arena, or the image an earlier dump left it in, which stays open and usable),
//! a running one runs on (the pause the restore began with is undone).
//!
//! **Keep until commit.** The load goes into new device memory and the old bytes are kept
//! until the digest passed ([`vmm::Vmm::load_all`] / [`vmm::PendingRestore`],
//! [`handles::load`] / [`handles::PendingHandles`]), rather than staging the image into new
//! host copies and swapping: a paused process's memory is off the device (its host copies,
//! or the file), so loading into the device memory the restore needs anyway costs no
//! memory beyond what a successful restore holds at its end plus the old copies the pause
//! already held, and no extra copy of any byte; staging into host memory would need a
//! second host copy of the whole image and a second pass over its bytes. The old host
//! copies are given up only at the commit (peak host memory as during the pause), and a
//! failure on device k releases what devices 0..k loaded: their old bytes were never
//! touched.
//!
//! One image holds every device's memory (format 1.3): the table lists each device's
//! allocations (ids made unique across devices by [`image_id`]) and then its driver-handle
//! ranges, device by device in ordinal order, and the image names each device (ordinal,
//! name, UUID). A restore checks that the process has memory on the same devices, each the
//! same GPU where both know its UUID, and loads them one after the other, committing them
//! together once the digest passed.

use crate::evict::{self, image_id, vmm_id, Load};
use crate::failure::{Failure, Report};
use crate::host::host;
use crate::memory::{self, DeviceMemory};
use crate::state::{Ctl, Held};
use crate::{config, handles, log, staging};
use ckpt::{
    AllocationRecord, GpuInfo, ImageError, ImageMetadata, ImageReader, ImageWriter, ProcessInfo,
    WriterOptions,
};
use cudaw_control::{Dumped, ErrorKind, Moved, Phase, Progress, Restored, State};
use driver::DriverBackend;
use std::cell::RefCell;
use std::fs::File;
use std::path::Path;
use std::time::Instant;
use vmm::{Allocation, Residency, VmmError};

/// Bytes handed to the writer at a time (progress granularity).
const WRITE_PIECE: usize = 8 << 20;

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// The devices with memory in an image: their ordinals and memory, by ordinal.
type Devices = Vec<(i32, &'static DeviceMemory)>;

/// Every device with allocations or evicted driver handles, by ordinal (none: no device
/// memory anywhere).
fn devices_with_memory() -> Result<Devices, Failure> {
    let mut with: Devices = memory::managed_devices()
        .filter(|(_, m)| m.vmm.stats().allocations > 0)
        .collect();
    for d in handles::evicted_devices() {
        if !with.iter().any(|(o, _)| *o == d) {
            let m = memory::device_without_runtime(d)
                .map_err(|e| Failure::new(ErrorKind::Failed, format!("device {d}: error {e}")))?;
            with.push((d, m));
        }
    }
    with.sort_by_key(|(o, _)| *o);
    Ok(with)
}

/// The process's table as an image holds it, device by device in ordinal order: its
/// allocations in creation order, then its evicted driver handles' mapped ranges.
fn process_table(devices: &Devices) -> Vec<AllocationRecord> {
    let mut t = Vec::new();
    for &(ordinal, m) in devices {
        t.extend(m.vmm.snapshot().iter().map(|a| record(ordinal, a)));
        t.extend(handles::image_records(ordinal));
    }
    t
}

fn record(ordinal: i32, a: &Allocation) -> AllocationRecord {
    AllocationRecord {
        id: image_id(ordinal, a.id.0),
        base: a.base,
        size: a.size,
        order: a.order,
        tag: a.tag,
        handle: None,
        device: ordinal as u32,
    }
}

fn addressing() -> ckpt::Addressing {
    match config::get().addressing {
        config::Addressing::Mapped => ckpt::Addressing::Mapped,
        config::Addressing::Translated => ckpt::Addressing::Translated,
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The CUDA major of this build (`libcudart.so.13` → 13).
fn runtime_major() -> u32 {
    host()
        .runtime_soname()
        .strip_prefix("libcudart.so.")
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn gpu_info(dev: Option<&(i32, &DeviceMemory)>) -> GpuInfo {
    let mut g = GpuInfo {
        name: String::new(),
        uuid: String::new(),
        compute_capability_major: 0,
        compute_capability_minor: 0,
        total_memory: 0,
        ordinal: None,
    };
    let Some(&(ordinal, m)) = dev else { return g };
    g.ordinal = u32::try_from(ordinal).ok();
    let b = m.vmm.backend();
    let (drv, d) = (b.driver(), b.device());
    g.name = drv.device_name(d).unwrap_or_default();
    use driver::sys::CUdevice_attribute as A;
    let attr = |a| {
        drv.device_attribute(d, a)
            .ok()
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(0)
    };
    g.compute_capability_major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    g.compute_capability_minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    g.total_memory = drv.device_total_mem(d).unwrap_or(0);
    // From the driver (the control thread does not call the real runtime while the
    // process is paused); empty when the driver gives none.
    g.uuid = drv
        .device_uuid(d)
        .ok()
        .and_then(|u| memory::uuid_text(&u))
        .unwrap_or_default();
    g
}

fn metadata(devices: &Devices) -> ImageMetadata {
    ImageMetadata {
        process: ProcessInfo {
            pid: std::process::id(),
            executable: std::fs::read_link("/proc/self/exe")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            hostname: hostname(),
            cudaw_version: env!("CARGO_PKG_VERSION").to_owned(),
            created_unix_nanos: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            cuda_runtime_major: runtime_major(),
            addressing: addressing(),
        },
        gpu: gpu_info(devices.first()),
        other_gpus: devices.iter().skip(1).map(|d| gpu_info(Some(d))).collect(),
    }
}

/// How a reader's or writer's error is classed: the file system's, or the image's.
fn image_failure(path: &Path, what: &str, e: ImageError) -> Failure {
    match e {
        ImageError::Io { .. } => {
            Failure::new(ErrorKind::Io, format!("{what} {}: {e}", path.display()))
        }
        // The process may read files its requester cannot: no byte of the file is quoted.
        e => Failure::new(
            ErrorKind::BadImage,
            format!("{}: {}", path.display(), e.message_without_content()),
        ),
    }
}

thread_local! {
    /// The file the client passed with the request being carried out on this thread.
    static PASSED: RefCell<Option<File>> = const { RefCell::new(None) };
}

/// Runs `f` (a dump or restore through the request handler) with `file`, the file the client
/// passed with the request: the image to write (created by the client beside the path it
/// names) or the image to read. Taken by the first dump or restore `f` runs.
pub(crate) fn with_passed_file<R>(file: File, f: impl FnOnce() -> R) -> R {
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            PASSED.with(|p| p.borrow_mut().take());
        }
    }
    PASSED.with(|p| *p.borrow_mut() = Some(file));
    let _clear = Clear;
    f()
}

fn take_passed() -> Option<File> {
    PASSED.with(|p| p.borrow_mut().take())
}

/// An image file failure: the file system's reason, or the refusal of a path that is not
/// a regular file.
fn file_failure(what: &str, path: &Path, e: cudaw_files::FileError) -> Failure {
    match e {
        cudaw_files::FileError::Io { source, .. } => Failure::new(
            ErrorKind::Io,
            format!("cannot {what} {}: {source}", path.display()),
        ),
        e => Failure::new(ErrorKind::Io, format!("cannot {what}: {e}")),
    }
}

/// Opens an image and checks everything but the data: the file the client passed, or
/// `path`, opened without following a link or blocking on a FIFO, a regular file only.
fn open_image(path: &Path) -> Result<ImageReader<File>, Failure> {
    let f = match take_passed() {
        Some(f) => {
            cudaw_files::check_input(&f, path)
                .map_err(|e| file_failure("open the image", path, e))?;
            f
        }
        None => cudaw_files::open_input(path, cudaw_files::Follow::No)
            .map_err(|e| file_failure("open the image", path, e))?,
    };
    read_image(f, path)
}

fn read_image(mut f: File, path: &Path) -> Result<ImageReader<File>, Failure> {
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).map_err(|e| {
        Failure::new(
            ErrorKind::Io,
            format!("cannot read the image {}: {e}", path.display()),
        )
    })?;
    ImageReader::open(f).map_err(|e| image_failure(path, "reading", e))
}

/// Where a dump writes: a temporary beside the path, renamed into place once written, or
/// the file the client passed (which it renames).
enum Output {
    New(cudaw_files::NewFile),
    Passed(File),
}

impl Output {
    fn create(path: &Path) -> Result<Output, Failure> {
        if let Some(f) = take_passed() {
            let fail = |e: std::io::Error| {
                Failure::new(
                    ErrorKind::Io,
                    format!("cannot write the image {}: {e}", path.display()),
                )
            };
            cudaw_files::check_input(&f, path)
                .map_err(|e| file_failure("write the image", path, e))?;
            f.set_len(0).map_err(fail)?;
            return Ok(Output::Passed(f));
        }
        if !path.is_absolute() {
            return Err(Failure::new(
                ErrorKind::Request,
                format!("the image path {} is not absolute", path.display()),
            ));
        }
        cudaw_files::NewFile::create(path)
            .map(Output::New)
            .map_err(|e| file_failure("create the image", path, e))
    }

    fn file(&self) -> &File {
        match self {
            Output::New(n) => n.file(),
            Output::Passed(f) => f,
        }
    }

    /// The image, written: renamed into place (or left to the client), open for reading.
    fn finish(self, path: &Path) -> Result<File, Failure> {
        match self {
            Output::New(n) => n
                .commit()
                .map_err(|e| file_failure("write the image", path, e)),
            Output::Passed(f) => Ok(f),
        }
    }
}

/// Writes the image of `devices`' memory into `file`. Returns the allocation count and
/// bytes.
fn write_image(
    file: File,
    path: &Path,
    devices: &Devices,
    old: Option<&mut ImageReader<File>>,
    report: Report<'_>,
) -> Result<(u64, u64), Failure> {
    let table = process_table(devices);
    let meta = metadata(devices);
    // Writeback starts as the image is written, not at the final fsync: the dump runs at
    // the disk's speed ([`cudaw_files::Streamed`]).
    let out = cudaw_files::Streamed::new(file);
    let mut w = ImageWriter::begin(out, &meta, &table, WriterOptions::default())
        .map_err(|e| image_failure(path, "writing", e))?;
    let total: u64 = table.iter().map(|r| r.size).sum();
    let mut image = Writing {
        w: &mut w,
        path,
        old,
        buf: Vec::new(),
        done: 0,
        total,
        report,
    };
    image.advance(0);
    // In table order: each device's allocations, then its driver-handle ranges (from the
    // host copies the pause made, or from the image a previous dump left them in).
    for &(ordinal, m) in devices {
        for a in &m.vmm.snapshot() {
            image.allocation(ordinal, m, a)?;
        }
        for r in table
            .iter()
            .filter(|r| r.handle.is_some() && r.size > 0 && r.device == ordinal as u32)
        {
            image.handle_range(r.id, r.size)?;
        }
    }
    let out = w.finish().map_err(|e| image_failure(path, "writing", e))?;
    out.finish().map_err(|e| {
        Failure::new(
            ErrorKind::Io,
            format!("writing {} (flushing and fsync): {e}", path.display()),
        )
    })?;
    Ok((table.len() as u64, total))
}

/// An image being written: where each allocation's bytes come from, and the progress.
struct Writing<'w, 'r, 'a> {
    w: &'w mut ImageWriter<cudaw_files::Streamed>,
    path: &'w Path,
    /// The image a previous dump left allocations in.
    old: Option<&'r mut ImageReader<File>>,
    /// One chunk of `old`.
    buf: Vec<u8>,
    done: u64,
    total: u64,
    report: Report<'a>,
}

impl Writing<'_, '_, '_> {
    fn advance(&mut self, n: u64) {
        self.done += n;
        (self.report)(Progress {
            phase: Phase::Write,
            done: self.done,
            total: self.total,
        });
    }

    fn fail(&self, e: ImageError) -> Failure {
        image_failure(self.path, "writing", e)
    }

    /// Writes `bytes` as allocation `id`'s, in pieces of [`WRITE_PIECE`].
    fn write_bytes(&mut self, id: u64, bytes: &[u8]) -> Result<(), ImageError> {
        for (i, piece) in bytes.chunks(WRITE_PIECE).enumerate() {
            self.w.write_chunk(id, (i * WRITE_PIECE) as u64, piece)?;
            self.advance(piece.len() as u64);
        }
        Ok(())
    }

    /// Writes allocation `a` of device `ordinal`'s memory `m`: from its host copy (held by
    /// the VMM or retained in the host arena), or from the image a previous dump left it
    /// in.
    fn allocation(
        &mut self,
        ordinal: i32,
        m: &DeviceMemory,
        a: &Allocation,
    ) -> Result<(), Failure> {
        if a.size == 0 {
            return Ok(());
        }
        let id = image_id(ordinal, a.id.0);
        match a.residency {
            Residency::Resident => Err(Failure::new(
                ErrorKind::Failed,
                format!(
                    "allocation {} of device {ordinal} at {:#x} is on the device while paused",
                    a.id.0, a.base
                ),
            )),
            Residency::EvictedToHost => {
                let mut write = |bytes: &[u8]| self.write_bytes(id, bytes);
                // Held by the VMM, or retained in the staging's host arena.
                let r = match m.vmm.with_host_copy(a.id, &mut write) {
                    Err(VmmError::NoHostCopy { .. }) => staging::with_retained(
                        m.vmm.backend(),
                        a.id,
                        &mut write,
                    )
                    .ok_or_else(|| {
                        Failure::new(
                            ErrorKind::Failed,
                            format!(
                                "allocation {} of device {ordinal}: no host copy, none in the host arena",
                                a.id.0
                            ),
                        )
                    })?,
                    other => other.map_err(|e| {
                        Failure::new(
                            ErrorKind::Failed,
                            format!("allocation {} of device {ordinal}: {e}", a.id.0),
                        )
                    })?,
                };
                r.map_err(|e| self.fail(e))
            }
            Residency::InFile { .. } => self.copy_from_image(id, a.size),
        }
    }

    /// Writes the evicted driver-handle range `id` (`size` bytes): from the host copy the
    /// pause made, or from the image a previous dump left it in.
    fn handle_range(&mut self, id: u64, size: u64) -> Result<(), Failure> {
        let in_memory =
            handles::with_saved(id, |bytes| bytes.map(|bytes| self.write_bytes(id, bytes)))
                .map_err(|e| Failure::new(ErrorKind::Failed, e))?;
        match in_memory {
            Some(r) => r.map_err(|e| self.fail(e)),
            None => self.copy_from_image(id, size),
        }
    }

    /// Copies allocation `id` (`size` bytes) from the image that holds it.
    fn copy_from_image(&mut self, id: u64, size: u64) -> Result<(), Failure> {
        let Writing {
            w,
            path,
            old,
            buf,
            done,
            total,
            report,
        } = self;
        let Some(img) = old.as_deref_mut() else {
            return Err(Failure::new(
                ErrorKind::Failed,
                format!("allocation {id:#x} is in an image, but no image is open"),
            ));
        };
        let cs = img.chunk_size().min(size) as usize;
        if buf.len() < cs {
            buf.resize(cs, 0);
        }
        let mut off = 0u64;
        while off < size {
            let n = (size - off).min(cs as u64) as usize;
            img.read_range(id, off, &mut buf[..n]).map_err(|e| {
                Failure::new(
                    ErrorKind::BadImage,
                    format!("reading allocation {id:#x} from the image that holds it: {e}"),
                )
            })?;
            w.write_chunk(id, off, &buf[..n])
                .map_err(|e| image_failure(path, "writing", e))?;
            off += n as u64;
            *done += n as u64;
            report(Progress {
                phase: Phase::Write,
                done: *done,
                total: *total,
            });
        }
        Ok(())
    }
}

/// Undoes the pause a request began with, after it failed; returns what to add to the
/// error message.
fn undo_pause(ctl: &mut Ctl, we_paused: bool) -> &'static str {
    if !we_paused {
        return "; the process is still paused, its memory as it was";
    }
    match evict::resume(ctl, &mut |_| {}) {
        Ok(_) => "; the process was resumed",
        Err(e) => {
            log::error(format_args!("undoing the pause failed: {e}"));
            "; the process stays paused (resuming it failed too: see its log)"
        }
    }
}

/// `cudaw-ckpt dump`.
pub(crate) fn dump(
    ctl: &mut Ctl,
    path: &Path,
    leave_running: bool,
    keep_shared: bool,
    report: Report<'_>,
) -> Result<Dumped, Failure> {
    let started = Instant::now();
    // Before touching the process: the image can hold its memory, and the file can be
    // created.
    let shared_out = handles::shared::evicted();
    if shared_out > 0 {
        return Err(Failure::new(
            ErrorKind::Unsupported,
            format!(
                "{shared_out} driver-level handles this process shares with the job's others are evicted (the job was paused with `cudaw-ckpt pause --job`): dump the whole job with `cudaw-ckpt dump --job`, which brings them back first; no image was written"
            ),
        ));
    }
    if let Some((n, bytes, first)) = handles::unevictable(keep_shared) {
        let job = if first.contains("shareable handle") {
            " (memory shared with another process, such as NCCL's buffers between the ranks of a job: dump the whole job with `cudaw-ckpt dump --job`, which leaves them on the device while every rank is paused)"
        } else {
            ""
        };
        return Err(Failure::new(
            ErrorKind::Unsupported,
            format!(
                "the process holds {n} driver-level memory handles ({bytes} bytes, from cuMemCreate) that a pause cannot evict ({first}); a checkpoint image cannot hold them, so no image was written{job}"
            ),
        ));
    }
    if keep_shared {
        if let Some((n, bytes)) = handles::shared::totals() {
            log::info(format_args!(
                "dump: {n} driver-level handles ({bytes} bytes) shared with other processes stay on the device, outside the image (a job dump: every process of the job is paused)"
            ));
        }
    }
    // Dropped on any failure below: the temporary goes with it.
    let output = Output::create(path)?;
    let we_paused = !ctl.paused;
    let pause_moved = if we_paused {
        match evict::pause(report) {
            Ok(m) => {
                ctl.paused = true;
                ctl.paused_by = None;
                m
            }
            Err(e) => return Err(e),
        }
    } else {
        Moved::default()
    };
    let write_started = Instant::now();
    let written = devices_with_memory().and_then(|devices| {
        let old = ctl.image.as_mut().map(|h| &mut h.reader);
        let file = output
            .file()
            .try_clone()
            .map_err(|e| Failure::new(ErrorKind::Io, format!("writing {}: {e}", path.display())))?;
        let n = write_image(file, path, &devices, old, report)?;
        let f = output.finish(path)?;
        Ok((devices, n, f))
    });
    let (devices, (allocations, bytes), file) = match written {
        Ok(v) => v,
        Err(mut e) => {
            e.message.push_str(undo_pause(ctl, we_paused));
            log::error(format_args!("dump: {}", e.message));
            return Err(e);
        }
    };
    let write_ms = ms(write_started);
    // Read back through the same file: what later resumes read, checked as written.
    let reader = match read_image(file, path) {
        Ok(r) => r,
        Err(mut e) => {
            e.message = format!("the image just written does not read back: {}", e.message);
            e.message.push_str(undo_pause(ctl, we_paused));
            log::error(format_args!("dump: {}", e.message));
            return Err(e);
        }
    };
    let image_bytes = reader.header().file_len;
    let digest = reader.trailer().digest;
    let (resume, state) = if leave_running {
        let m = evict::resume(ctl, report).map_err(|mut e| {
            e.message = format!(
                "the image {} is written, but resuming failed: {}",
                path.display(),
                e.message
            );
            e
        })?;
        (Some(m), State::Running)
    } else {
        mark_in_image(&devices, &reader);
        // From now on the bytes live only in the new image.
        ctl.image = Some(Held {
            path: path.to_path_buf(),
            reader,
        });
        (None, State::Paused)
    };
    let total_ms = ms(started);
    log::info(format_args!(
        "dumped: {allocations} allocations, {bytes} bytes to {} ({image_bytes} bytes) in {write_ms:.1} ms; {}",
        path.display(),
        state.as_str()
    ));
    Ok(Dumped {
        path: path.to_string_lossy().into_owned(),
        image_bytes,
        allocations,
        bytes,
        digest,
        pause: pause_moved,
        write_ms,
        resume,
        state,
        ms: total_ms,
    })
}

/// After a dump that leaves the process paused: every allocation of `devices` and every
/// evicted driver-handle range is marked as held in the image `reader` reads, and its host
/// copy freed.
fn mark_in_image(devices: &Devices, reader: &ImageReader<File>) {
    let entries = reader.allocations();
    let handle_ranges: Vec<u64> = entries
        .iter()
        .filter(|e| e.record.handle.is_some())
        .map(|e| e.record.id)
        .collect();
    handles::mark_in_image(&handle_ranges);
    for e in entries.iter().filter(|e| e.record.handle.is_none()) {
        let (id, device) = (vmm_id(e.record.id), e.record.device);
        let Some((_, m)) = devices.iter().find(|(o, _)| *o as u32 == device) else {
            continue;
        };
        match m.vmm.mark_in_file(id, e.data_offset) {
            Ok(()) => staging::forget(m.vmm.backend(), id),
            // Its host copy stays; the image holds it too.
            Err(e) => log::warn(format_args!(
                "dump: allocation {} of device {device}: {e}",
                id.0
            )),
        }
    }
}

/// Every way `reader` does not fit this process; empty when it fits. `--force` is
/// suggested only where it would help: the image is another process's and nothing else
/// differs.
fn mismatches(reader: &ImageReader<File>, devices: &Devices, force: bool) -> Vec<String> {
    let mut why = Vec::new();
    let meta = reader.metadata();
    let (pid, host) = (std::process::id(), hostname());
    let foreign = meta.process.pid != pid || meta.process.hostname != host;
    if meta.process.addressing != addressing() {
        why.push(format!(
            "it was made in {:?} addressing, this process uses {:?}",
            meta.process.addressing,
            addressing()
        ));
    }
    let table = process_table(devices);
    let diff = reader.check_against(&table);
    if !diff.is_empty() {
        why.push(table_differences(
            reader.allocations().len(),
            table.len(),
            &diff,
        ));
    }
    why.extend(device_differences(meta, devices));
    if foreign && !force {
        let made_by = format!(
            "it was made by process {} ({}) on host {:?}, not by this process ({pid} on {host:?})",
            meta.process.pid, meta.process.executable, meta.process.hostname
        );
        let hint = if why.is_empty() {
            "; its allocation table matches this process's, so --force would restore it"
        } else {
            " (--force would not help: it accepts another process's image only when nothing else differs)"
        };
        why.insert(0, format!("{made_by}{hint}"));
    }
    why
}

/// How the image's devices differ from those the process has memory on: other ordinals,
/// or another GPU (UUID) at the same ordinal. An image of format 1.0 names no ordinal, and
/// a device without a UUID (simgpu) is matched by its ordinal alone.
fn device_differences(meta: &ckpt::ImageMetadata, devices: &Devices) -> Vec<String> {
    let mut why = Vec::new();
    let in_image: Vec<u32> = meta.gpus().filter_map(|g| g.ordinal).collect();
    let in_process: Vec<u32> = devices.iter().map(|&(o, _)| o as u32).collect();
    let names_memory = !meta.gpu.name.is_empty() || !meta.other_gpus.is_empty();
    let list = |v: &[u32]| match v {
        [] => "no device".to_owned(),
        [one] => format!("device {one}"),
        many => format!(
            "devices {}",
            many.iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if names_memory && meta.gpu.ordinal.is_some() && in_image != in_process {
        why.push(format!(
            "it holds the memory of {}, the process has memory on {}",
            list(&in_image),
            list(&in_process)
        ));
    }
    for d in devices {
        let Some(g) = meta.gpu_of(d.0 as u32) else {
            continue;
        };
        let here = gpu_info(Some(d));
        if !g.uuid.is_empty() && !here.uuid.is_empty() && g.uuid != here.uuid {
            why.push(format!(
                "its device {}'s memory is from GPU {} ({}), device {} of the process is GPU {} ({})",
                d.0, g.uuid, g.name, d.0, here.uuid, here.name
            ));
        }
    }
    why
}

/// What differs between the image's allocation table and the process's: how many
/// allocations differ in what, and the first difference with both values.
fn table_differences(in_image: usize, in_process: usize, diff: &[ckpt::Difference]) -> String {
    use ckpt::Difference as D;
    let count = |f: fn(&D) -> bool| diff.iter().filter(|d| f(d)).count();
    let kinds = [
        (count(|d| matches!(d, D::BaseMismatch { .. })), "in address"),
        (count(|d| matches!(d, D::SizeMismatch { .. })), "in size"),
        (
            count(|d| matches!(d, D::OrderMismatch { .. })),
            "in creation order",
        ),
        (
            count(|d| matches!(d, D::DeviceMismatch { .. })),
            "in device",
        ),
        (
            count(|d| matches!(d, D::HandleMismatch { .. })),
            "in driver handle",
        ),
        (
            count(|d| matches!(d, D::MissingFromProcess { .. })),
            "only in the image",
        ),
        (
            count(|d| matches!(d, D::MissingFromImage { .. })),
            "only in the process",
        ),
    ];
    let what: Vec<String> = kinds
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, k)| {
            let verb = match (*n, k.starts_with("only")) {
                (1, true) => "is",
                (_, true) => "are",
                (1, false) => "differs",
                _ => "differ",
            };
            format!("{n} {verb} {k}")
        })
        .collect();
    let mut s = format!(
        "its allocation table differs from the process's (the image has {in_image} allocations, the process {in_process}): {}; the first: {}",
        what.join(", "),
        diff[0]
    );
    const SHOWN: usize = 3;
    for d in diff.iter().skip(1).take(SHOWN - 1) {
        s.push_str(&format!("; then: {d}"));
    }
    match diff.len().saturating_sub(SHOWN) {
        0 => {}
        1 => s.push_str("; and 1 more difference"),
        n => s.push_str(&format!("; and {n} more differences")),
    }
    s
}

/// `cudaw-ckpt restore`.
pub(crate) fn restore(
    ctl: &mut Ctl,
    path: &Path,
    force: bool,
    report: Report<'_>,
) -> Result<Restored, Failure> {
    let started = Instant::now();
    // Before touching the process: the file is a readable image of this format.
    let mut reader = open_image(path).inspect_err(|e| {
        log::warn(format_args!("restore refused: {}", e.message));
    })?;
    let we_paused = !ctl.paused;
    let pause_moved = if we_paused {
        let m = evict::pause(report)?;
        ctl.paused = true;
        ctl.paused_by = None;
        m
    } else {
        Moved::default()
    };
    let refuse = |ctl: &mut Ctl, mut e: Failure| -> Failure {
        e.message.push_str(undo_pause(ctl, we_paused));
        log::warn(format_args!("restore refused: {}", e.message));
        e
    };
    let devices = match devices_with_memory() {
        Ok(d) => d,
        Err(e) => return Err(refuse(ctl, e)),
    };
    let why = mismatches(&reader, &devices, force);
    if !why.is_empty() {
        let e = Failure::new(
            ErrorKind::Mismatch,
            format!(
                "{} is not an image of this process: {}",
                path.display(),
                why.join("; ")
            ),
        );
        return Err(refuse(ctl, e));
    }
    // One read of the image: every allocation loaded into new device memory, each chunk
    // checked as it is read, the process's own copies kept; then the image digest; only
    // then is the load committed.
    let load_started = Instant::now();
    let total = reader.trailer().data_bytes;
    reader.begin_load();
    let mut load = Load::new(Some(&mut reader), true, total, report);
    // The image's memory was the process's: the node's limit is lifted while it loads.
    let lifted = memory::NodeLimitLifted::new();
    let loaded = load_image(&devices, &mut load);
    drop(lifted);
    let loaded = match loaded {
        Ok(l) => l,
        Err(f) => {
            drop(load);
            let e = Failure::new(
                f.kind,
                format!(
                    "loading {} failed: {} (the load was rolled back)",
                    path.display(),
                    f.message
                ),
            );
            return Err(refuse(ctl, e));
        }
    };
    let load_ms = ms(load_started);
    let check_started = Instant::now();
    let checked = finish_load(&mut load, &devices);
    let verify_ms = ms(check_started);
    if let Err(e) = checked {
        drop(loaded);
        drop(load);
        let e = Failure::new(
            e.kind,
            format!(
                "loading {} failed: {} (the load was rolled back)",
                path.display(),
                e.message
            ),
        );
        return Err(refuse(ctl, e));
    }
    let (allocations, bytes) = loaded.commit(&mut load);
    let image_times = load.image_times();
    drop(load);
    // Every allocation is on the device: no image holds the process's memory any more.
    ctl.image = None;
    ctl.paused = false;
    ctl.paused_by = None;
    host().open_gate();
    let total_ms = ms(started);
    log::info(format_args!(
        "restored: {allocations} allocations, {bytes} bytes from {} ({} bytes of the {}-byte image read once: loaded in {load_ms:.1} ms, digest checked in {verify_ms:.1} ms{image_times}); running",
        path.display(),
        reader.bytes_read(),
        reader.header().file_len,
    ));
    Ok(Restored {
        path: path.to_string_lossy().into_owned(),
        allocations,
        bytes,
        pause: pause_moved,
        verify_ms,
        load_ms,
        state: State::Running,
        ms: total_ms,
    })
}

/// After the load: the copies reach every device, then the image's digest (over every
/// chunk's checksum, read as the load read them: no second read of the data) matches its
/// trailer's. A failure here rolls the load back.
fn finish_load(load: &mut Load<'_>, devices: &Devices) -> Result<(), Failure> {
    for &(o, m) in devices {
        m.vmm.backend().synchronize().map_err(|e| {
            Failure::new(
                ErrorKind::Failed,
                format!("synchronising device {o} after the load: {e}"),
            )
        })?;
    }
    let Load { image, report, .. } = load;
    let Some(img) = image.as_deref_mut() else {
        return Ok(());
    };
    // Reads only the chunks the load did not (none, unless an allocation was not loaded).
    img.finish_load(|done| {
        report(Progress {
            phase: Phase::Verify,
            done,
            total: done,
        })
    })
    .map(drop)
    .map_err(|e| match e {
        ImageError::Io { .. } => Failure::new(ErrorKind::Io, format!("reading the image: {e}")),
        e => Failure::new(ErrorKind::BadImage, e.message_without_content()),
    })
}

/// An image loaded into every device, not yet committed: dropped, the load is rolled back
/// (the new memory released, the process's memory where it was).
struct Loaded {
    devices: Vec<(
        &'static DeviceMemory,
        vmm::PendingRestore<'static, DriverBackend>,
    )>,
    handles: handles::PendingHandles,
}

impl Loaded {
    /// Commits the load (it cannot fail): the allocations and bytes loaded.
    fn commit(self, load: &mut Load<'_>) -> (u64, u64) {
        let Loaded { devices, handles } = self;
        // The handles first: the host arena's bookkeeping below reads their table.
        let h = handles.commit(load);
        let (mut allocations, mut bytes) = (h.handles as u64, h.bytes);
        for (m, pending) in devices {
            let moved = pending.commit(load);
            allocations += moved.allocations as u64;
            bytes += moved.bytes;
            evict::arena_after_restore(m, 0);
        }
        (allocations, bytes)
    }
}

/// Loads the image into every device's allocations, device by device, then into the
/// evicted driver handles, committing nothing ([`Loaded`]): or the failure (its kind and
/// where), everything loaded so far rolled back.
fn load_image(devices: &Devices, load: &mut Load<'_>) -> Result<Loaded, Failure> {
    (load.report)(Progress {
        phase: Phase::Load,
        done: 0,
        total: load.total,
    });
    let kind = |load: &Load<'_>| match &load.image_error {
        Some(ImageError::Io { .. }) => ErrorKind::Io,
        Some(_) => ErrorKind::BadImage,
        None => ErrorKind::Failed,
    };
    let mut pending = Vec::with_capacity(devices.len());
    for &(ordinal, m) in devices {
        match m.vmm.load_all(load) {
            Ok(p) => pending.push((m, p)),
            Err(e) => {
                // Dropping `pending` releases what the devices before it loaded.
                let before = if pending.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; the devices loaded before it were rolled back too ({} bytes)",
                        pending.iter().map(|(_, p)| p.moved().bytes).sum::<u64>()
                    )
                };
                return Err(Failure::new(
                    kind(load),
                    format!("device {ordinal}: {e}{before}"),
                ));
            }
        }
    }
    // Driver-handle ranges, from the image too.
    match handles::load(load) {
        Ok(handles) => Ok(Loaded {
            devices: pending,
            handles,
        }),
        Err(e) => Err(Failure::new(
            kind(load),
            format!("driver handles: {e}; the allocations loaded before them were rolled back too"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_ids_are_unique_across_devices_and_map_back() {
        use crate::evict::DEVICE_SHIFT;
        // Device 0's ids as they were: images of one device 0 read as before.
        assert_eq!(image_id(0, 7), 7);
        let on_1 = image_id(1, 7);
        let on_63 = image_id(63, 7);
        assert!(on_1 != 7 && on_63 != on_1);
        for (o, id) in [(0, 7), (1, 7), (63, (1 << DEVICE_SHIFT) - 1)] {
            assert_eq!(vmm_id(image_id(o, id)), vmm::AllocationId(id));
        }
        // Driver-handle range ids are unique already: kept, and never met by VMM ids.
        let range = handles::TAG | 5 | (3 << 48);
        assert_eq!(image_id(2, range), range);
        assert!(image_id(63, (1 << DEVICE_SHIFT) - 1) < handles::TAG);
    }
}
