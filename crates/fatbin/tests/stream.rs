//! The streaming path on a synthetic fatbin of many zstd cubins: at most `threads` images
//! decompressed at once, results in input order whatever the thread count, a file read
//! through `pread` equal to the same bytes in memory, and the caller's error stopping it.

use std::sync::atomic::{AtomicUsize, Ordering};

use fatbin::{decode_in_order, Decoder, StreamIndex};

mod synthetic;
use synthetic::synthetic_fatbin;

#[test]
fn at_most_threads_images_at_once_and_results_in_order() {
    const MIB: usize = 1 << 20;
    let data = synthetic_fatbin(300, 6, MIB);
    let index = StreamIndex::read(data.as_slice()).unwrap();
    assert_eq!(index.entries().len(), 300);
    let all = index.loadable();
    let want: Vec<u64> = all.iter().map(|&i| index.entries()[i].offset).collect();
    for threads in [1, 2, 3, 8] {
        let mut seen = Vec::new();
        let stats = decode_in_order(
            data.as_slice(),
            &index,
            &all,
            threads,
            |(): &mut (), entry, kernels| {
                assert_eq!(kernels, Ok(Vec::new()), "entry at {:#x}", entry.offset);
                entry.offset
            },
            |offset| {
                seen.push(offset);
                Ok::<_, ()>(())
            },
        )
        .unwrap();
        assert_eq!(seen, want, "{threads} thread(s): results in input order");
        assert_eq!(stats.entries, 300);
        assert!(
            (1..=threads).contains(&stats.peak_images),
            "{threads} thread(s): {} images at once",
            stats.peak_images
        );
        assert!(stats.peak_waiting <= 2 * threads, "{stats:?}");
        // One image buffer and one small payload buffer per thread, never the input's
        // 300 MiB.
        assert!(
            stats.peak_buffer_bytes <= threads * (MIB + 64 * 1024),
            "{threads} thread(s): decoders held {} bytes",
            stats.peak_buffer_bytes
        );
        assert_eq!(stats.timings.decompressed_bytes, 300 * MIB as u64);
    }
}

#[test]
fn a_file_reads_as_the_same_bytes_in_memory() {
    let data = synthetic_fatbin(40, 4, 4096);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.fatbin");
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let from_file = StreamIndex::read(&file).unwrap();
    let in_memory = StreamIndex::read(data.as_slice()).unwrap();
    assert_eq!(from_file.containers().len(), 10);
    assert_eq!(from_file.entries().len(), in_memory.entries().len());
    let fb = fatbin::Fatbin::parse(&data).unwrap();
    let mut decoder = Decoder::new();
    for (i, e) in fb.entries().iter().enumerate() {
        assert_eq!(from_file.entries()[i].offset, e.offset);
        assert_eq!(decoder.kernels(&file, &from_file, i), e.kernels());
    }
    assert_eq!(from_file.select(86), in_memory.select(86));
    assert_eq!(from_file.select(86).len(), 10, "sm_80 from each container");

    // A file cut short: a clear error, not a panic.
    std::fs::write(&path, &data[..data.len() / 2 + 37]).unwrap();
    let cut = std::fs::File::open(&path).unwrap();
    let err = StreamIndex::read(&cut).unwrap_err();
    assert!(
        matches!(err, fatbin::Error::Truncated { .. }),
        "{err}: truncated expected"
    );
}

#[test]
fn the_callers_error_stops_the_work() {
    let data = synthetic_fatbin(100, 5, 8192);
    let index = StreamIndex::read(data.as_slice()).unwrap();
    let all = index.loadable();
    for threads in [1, 4] {
        let decoded = AtomicUsize::new(0);
        let mut taken = 0;
        let r = decode_in_order(
            data.as_slice(),
            &index,
            &all,
            threads,
            |(): &mut (), _, _| decoded.fetch_add(1, Ordering::Relaxed),
            |_| {
                taken += 1;
                if taken == 5 {
                    Err("enough")
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(r.unwrap_err(), "enough");
        assert_eq!(taken, 5);
        // Workers run ahead by at most 2 × threads entries.
        let n = decoded.load(Ordering::Relaxed);
        assert!(
            n <= 5 + 2 * threads + threads,
            "{threads} thread(s): {n} decoded"
        );
    }
}

#[test]
fn corrupt_entries_are_reported_in_place() {
    let mut data = synthetic_fatbin(12, 6, 4096);
    let index = StreamIndex::read(data.as_slice()).unwrap();
    // Garble entry 7's zstd frame (just past its header).
    let at = (index.entries()[7].offset + 0x40) as usize;
    data[at..at + 4].copy_from_slice(b"oops");
    let mut results = Vec::new();
    decode_in_order(
        data.as_slice(),
        &index,
        &index.loadable(),
        3,
        |(): &mut (), _, kernels| kernels.is_ok(),
        |ok| {
            results.push(ok);
            Ok::<_, ()>(())
        },
    )
    .unwrap();
    let mut want = vec![true; 12];
    want[7] = false;
    assert_eq!(results, want);
}
