//! The staging adapters eviction and restore go through: [`Evict`] hands the process's
//! pinned staging batches so that progress can be counted between them; [`Load`] loads
//! from host copies and from an image.

use crate::failure::Report;
use crate::staging::{self, staging};
use ckpt::{ImageError, ImageReader, RangeRead};
use cudaw_control::{Phase, Progress};
use driver::DriverBackend;
use std::fs::File;
use std::time::Instant;
use vmm::{Backend, HostCopy, LoadRange, Source, Staging, StagingError, StagingRange};

/// The process's pinned staging ([`staging()`]), given batches of about [`BATCH`] bytes so
/// that progress can be counted between them.
pub(super) struct Evict<'a> {
    pub(super) copied: &'a mut dyn FnMut(u64),
}

/// Bytes per save or load handed to the pinned staging at once (a progress step).
const BATCH: u64 = 512 << 20;

/// Splits `ranges` into consecutive runs of about [`BATCH`] bytes (a range is never split).
fn batches<T>(ranges: &[T], len: impl Fn(&T) -> u64) -> impl Iterator<Item = &[T]> {
    let mut rest = ranges;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (mut n, mut bytes) = (0, 0u64);
        while n < rest.len() && (n == 0 || bytes < BATCH) {
            bytes += len(&rest[n]);
            n += 1;
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    })
}

impl Staging<DriverBackend> for Evict<'_> {
    fn save(
        &mut self,
        backend: &DriverBackend,
        ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        let mut out = Vec::with_capacity(ranges.len());
        for batch in batches(ranges, |r| r.len) {
            out.extend(staging::save_for_pause(backend, batch)?);
            (self.copied)(batch.iter().map(|r| r.len).sum());
        }
        Ok(out)
    }

    fn load(
        &mut self,
        backend: &DriverBackend,
        ranges: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        staging().load(backend, ranges)
    }
}

/// Loads allocations onto the device: from the host copies the VMM holds and from an
/// image (the allocations a dump left in it, or every allocation for a restore when
/// `image_only`). A run of ranges in the image is read on a thread of its own, chunk by
/// chunk, a few chunks ahead of this thread, which checks each chunk (header, xxh3) and
/// copies it to the device meanwhile: the reads, the checks and the copies overlap. (With
/// the checks on the reader thread a 16 GiB restore ran at 1.15× one read of the image on
/// an H200 host, the disk idle while each chunk was hashed; apart, at 0.98×.)
pub(crate) struct Load<'a> {
    /// The image to read from.
    pub image: Option<&'a mut ImageReader<File>>,
    /// Load every range from the image, whatever the VMM holds (restore).
    pub image_only: bool,
    /// Bytes loaded so far.
    pub done: u64,
    /// Bytes to load in all.
    pub total: u64,
    /// Where progress goes.
    pub report: Report<'a>,
    /// The image's own failure, when reading it failed (a damaged file).
    pub image_error: Option<ImageError>,
    /// Time spent inside the staging's loads (the copies from host memory), for the
    /// phases a resume logs at debug level.
    pub in_staging: std::time::Duration,
    /// Reading the image: the reader thread's time in reads, this thread's in checking
    /// chunks and copying them to the device, and waiting for the reader
    /// ([`Load::image_times`]).
    pub reading: std::time::Duration,
    pub copying: std::time::Duration,
    pub waiting: std::time::Duration,
}

impl<'a> Load<'a> {
    pub(crate) fn new(
        image: Option<&'a mut ImageReader<File>>,
        image_only: bool,
        total: u64,
        report: Report<'a>,
    ) -> Self {
        Load {
            image,
            image_only,
            done: 0,
            total,
            report,
            image_error: None,
            in_staging: std::time::Duration::ZERO,
            reading: std::time::Duration::ZERO,
            copying: std::time::Duration::ZERO,
            waiting: std::time::Duration::ZERO,
        }
    }

    /// Where reading the image went, for the log: "" when nothing was read from it.
    pub(crate) fn image_times(&self) -> String {
        if self.reading.is_zero() {
            return String::new();
        }
        format!(
            "; the image read in {:.2} s (reader thread), its chunks checked and copied in {:.2} s, waiting for the reader {:.2} s",
            self.reading.as_secs_f64(),
            self.copying.as_secs_f64(),
            self.waiting.as_secs_f64()
        )
    }

    fn advance_by(&mut self, n: u64) {
        self.done += n;
        (self.report)(Progress {
            phase: Phase::Load,
            done: self.done,
            total: self.total,
        });
    }

    /// Loads `run` (ranges held in the image, in the order given) from the image: a
    /// reader thread fills chunk buffers ([`READ_AHEAD`] ahead), this one copies each to
    /// the device and hands the buffer back.
    fn load_run_from_image(
        &mut self,
        backend: &DriverBackend,
        run: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        let Some(img) = self.image.as_deref_mut() else {
            return Err(StagingError::Io(format!(
                "{} allocations are in an image, but no image is open",
                run.len()
            )));
        };
        // The VMM's ids are per device; the image's unique across devices.
        let pieces: Vec<(u64, u64, u64)> = run
            .iter()
            .map(|r| (image_id(backend.device(), r.id.0), r.addr, r.len))
            .collect();
        for &(id, _, len) in &pieces {
            match img.allocation(id).map(|e| e.record.size) {
                Some(size) if size == len => {}
                other => {
                    return Err(StagingError::Io(format!(
                        "allocation {id} ({len} bytes) is {} in the image",
                        other.map_or("missing".to_owned(), |s| format!("{s} bytes"))
                    )))
                }
            }
        }
        let largest = pieces.iter().map(|p| p.2).max().unwrap_or(0);
        let cs = img.chunk_size().min(largest.max(1));
        let cs = usize::try_from(cs).map_err(|_| StagingError::Io("chunk size".into()))?;
        type Filled = Result<(u64, Vec<u8>, RangeRead), ImageError>;
        let (filled_tx, filled_rx) = std::sync::mpsc::sync_channel::<Filled>(READ_AHEAD);
        let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<u8>>();
        for _ in 0..=READ_AHEAD {
            let _ = empty_tx.send(Vec::with_capacity(cs));
        }
        let reader_pieces = &pieces;
        let (mut copying, mut waiting) = (self.copying, self.waiting);
        let mut sums: Vec<(u64, u64)> = Vec::new();
        let (result, image_error, reading) = std::thread::scope(|s| {
            let reader = s.spawn(move || {
                let mut reading = std::time::Duration::ZERO;
                for &(id, addr, len) in reader_pieces {
                    let mut off = 0u64;
                    while off < len {
                        let n = (len - off).min(cs as u64) as usize;
                        // No buffer back: the copying side stopped.
                        let Ok(mut b) = empty_rx.recv() else {
                            return reading;
                        };
                        b.resize(n, 0);
                        // Read here, checked on the copying thread: the disk is not idle
                        // while a chunk's checksum is computed.
                        let t = Instant::now();
                        let read = img.read_range_unchecked(id, off, &mut b);
                        reading += t.elapsed();
                        let failed = read.is_err();
                        if filled_tx.send(read.map(|r| (addr + off, b, r))).is_err() || failed {
                            return reading;
                        }
                        off += n as u64;
                    }
                }
                reading
            });
            let mut result = Ok(());
            let mut image_error = None;
            let mut waited = Instant::now();
            for item in filled_rx.iter() {
                waiting += waited.elapsed();
                let t = Instant::now();
                match item.and_then(|(addr, b, read)| {
                    let checked = read.check(&b)?;
                    sums.extend(checked);
                    Ok((addr, b))
                }) {
                    Ok((addr, b)) => {
                        let copied = backend.copy_from_host(addr, &b);
                        copying += t.elapsed();
                        if let Err(e) = copied {
                            result = Err(e.into());
                            break;
                        }
                        self.done += b.len() as u64;
                        (self.report)(Progress {
                            phase: Phase::Load,
                            done: self.done,
                            total: self.total,
                        });
                        let _ = empty_tx.send(b);
                    }
                    Err(e) => {
                        result = Err(StagingError::Io(e.to_string()));
                        image_error = Some(e);
                        break;
                    }
                }
                waited = Instant::now();
            }
            // The reader, waiting for a buffer or to hand one over, sees both channels
            // closed and ends.
            drop(filled_rx);
            drop(empty_tx);
            let reading = reader
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            (result, image_error, reading)
        });
        self.reading += reading;
        self.copying = copying;
        self.waiting = waiting;
        // The checksums of the chunks checked, for the digest at the end of a restore.
        if let Some(img) = self.image.as_deref_mut() {
            img.loaded_checked(&sums);
        }
        if image_error.is_some() {
            self.image_error = image_error;
        }
        result
    }
}

/// Chunks the image's reader thread reads ahead of the copies (8 MiB each).
const READ_AHEAD: usize = 3;

impl Staging<DriverBackend> for Load<'_> {
    fn recycle(&mut self, copies: Vec<Vec<u8>>) {
        staging().recycle(copies);
    }

    fn save(
        &mut self,
        _backend: &DriverBackend,
        _ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        Err(StagingError::Io("this staging only loads".into()))
    }

    fn load(
        &mut self,
        backend: &DriverBackend,
        ranges: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        // Runs of ranges held in host memory go through the pinned staging a batch at a
        // time; ranges in the image are read chunk by chunk.
        let mut i = 0;
        while i < ranges.len() {
            let from_memory = |r: &LoadRange<'_>| {
                !self.image_only && matches!(r.source, Source::Memory(_) | Source::Retained)
            };
            if from_memory(&ranges[i]) {
                // Ranges in the host arena go in one call (straight copies, no host-side
                // work to pace: a wait between batches would only idle the copy engines);
                // those in pageable memory a batch at a time, for the progress reports.
                let retained = matches!(ranges[i].source, Source::Retained);
                let mut j = i;
                while j < ranges.len()
                    && from_memory(&ranges[j])
                    && matches!(ranges[j].source, Source::Retained) == retained
                {
                    j += 1;
                }
                let run = &ranges[i..j];
                let parts: Box<dyn Iterator<Item = &[LoadRange<'_>]>> = if retained {
                    Box::new(std::iter::once(run))
                } else {
                    Box::new(batches(run, |r| r.len))
                };
                for batch in parts {
                    let t = Instant::now();
                    staging().load(backend, batch)?;
                    self.in_staging += t.elapsed();
                    self.advance_by(batch.iter().map(|r| r.len).sum());
                }
                i = j;
                continue;
            }
            let mut j = i;
            while j < ranges.len() && !from_memory(&ranges[j]) {
                j += 1;
            }
            self.load_run_from_image(backend, &ranges[i..j])?;
            i = j;
        }
        Ok(())
    }
}

/// Bits of an image id that hold the VMM's id of an allocation; the device's ordinal is
/// above them.
pub(crate) const DEVICE_SHIFT: u32 = 40;

/// The image id of allocation `id` of device `ordinal`'s VMM (ids are per device, an
/// image's unique across devices): device 0's ids as they are (so images of device 0 read
/// as before), another device's with its ordinal from bit [`DEVICE_SHIFT`] on. A
/// driver-handle range's id ([`crate::handles::TAG`] and up) is unique already, and kept.
pub(crate) fn image_id(ordinal: i32, id: u64) -> u64 {
    if id >= crate::handles::TAG {
        id
    } else {
        id | (ordinal as u64) << DEVICE_SHIFT
    }
}

/// The VMM's id of the allocation whose image id is `id` ([`image_id`]).
pub(crate) fn vmm_id(id: u64) -> vmm::AllocationId {
    vmm::AllocationId(id & ((1 << DEVICE_SHIFT) - 1))
}
