//! [`Streamed`]: a large file written front to back at the disk's speed.

use rustix::fs::{self as rfs, Advice};
use std::fs::File;
use std::io::{self, Write};

/// Bytes written between two starts of writeback.
pub const WRITEBACK_WINDOW: u64 = 32 << 20;

/// Writes smaller than this are gathered (chunk headers and checksums), larger ones go
/// straight to the file: no copy of the payload in user space.
const GATHER: usize = 64 << 10;

/// A file written front to back in large pieces (a checkpoint image), whose writeback to
/// the disk starts as it is written rather than at the final `fsync`.
///
/// `dd conv=fsync` and a plain writer leave every byte dirty in the page cache until the
/// end (the kernel starts writing back only past `dirty_background_ratio` of memory, tens of
/// GB on a GPU host), so the final `fsync` then writes the whole file while nothing else
/// happens: the write of the file and its way to the disk add up. Here, every
/// [`WRITEBACK_WINDOW`] bytes, the writeback of the window just written is started
/// asynchronously, so the disk writes while the next bytes are produced and the `fsync` of
/// [`Streamed::finish`] waits only for the last window. (It is started with
/// `posix_fadvise(POSIX_FADV_DONTNEED)` on the window, which on Linux starts the
/// writeback of its dirty pages without waiting, as `sync_file_range(SYNC_FILE_RANGE_WRITE)`
/// does, and drops none of them while they are dirty or being written: this crate makes no
/// system call outside `rustix`'s safe ones. Elsewhere it is advice, and only speed
/// depends on it.) Small writes are gathered in a buffer; large ones are written as given.
#[derive(Debug)]
pub struct Streamed {
    file: File,
    gathered: Vec<u8>,
    /// Bytes handed to the file.
    written: u64,
    /// Bytes whose writeback was started.
    started: u64,
}

impl Streamed {
    /// Writes into `file` from its current position (a new, empty file: offsets count
    /// from 0).
    pub fn new(file: File) -> Streamed {
        Streamed {
            file,
            gathered: Vec::with_capacity(GATHER),
            written: 0,
            started: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written + self.gathered.len() as u64
    }

    /// Writes what is gathered, syncs the file (`fsync`: its data and length are on the
    /// disk) and gives it back.
    pub fn finish(mut self) -> io::Result<File> {
        self.flush()?;
        self.file.sync_all()?;
        Ok(self.file)
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.file.write_all(b)?;
        self.written += b.len() as u64;
        if self.written - self.started >= WRITEBACK_WINDOW {
            // Advice: a failure changes nothing but the speed.
            let _ = rfs::fadvise(
                &self.file,
                self.started,
                std::num::NonZeroU64::new(self.written - self.started),
                Advice::DontNeed,
            );
            self.started = self.written;
        }
        Ok(())
    }

    fn drain(&mut self) -> io::Result<()> {
        if !self.gathered.is_empty() {
            let g = std::mem::take(&mut self.gathered);
            let r = self.put(&g);
            self.gathered = g;
            self.gathered.clear();
            r?;
        }
        Ok(())
    }
}

impl Write for Streamed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if buf.len() < GATHER && self.gathered.len() + buf.len() <= GATHER {
            self.gathered.extend_from_slice(buf);
            return Ok(());
        }
        self.drain()?;
        if buf.len() < GATHER {
            self.gathered.extend_from_slice(buf);
            Ok(())
        } else {
            self.put(buf)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.drain()?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_pieces_arrive_in_order_across_windows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        let mut s = Streamed::new(File::create(&path).unwrap());
        let mut expected = Vec::new();
        let mut n = 0u8;
        // Headers and payloads, as an image is written, over more than two windows.
        while (expected.len() as u64) < 2 * WRITEBACK_WINDOW + (5 << 20) {
            for len in [24usize, 3 << 20, 8, 24, 100, 1 << 20, GATHER, GATHER - 1] {
                n = n.wrapping_add(1);
                let piece = vec![n; len];
                s.write_all(&piece).unwrap();
                expected.extend_from_slice(&piece);
                assert_eq!(s.written(), expected.len() as u64);
            }
        }
        let f = s.finish().unwrap();
        assert_eq!(f.metadata().unwrap().len(), expected.len() as u64);
        assert!(
            std::fs::read(&path).unwrap() == expected,
            "the bytes differ"
        );
    }
}
