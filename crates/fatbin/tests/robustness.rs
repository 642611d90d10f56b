//! Every real fatbin, cubin, PTX file and object built from the fixtures, truncated at many
//! lengths and with random bit flips (fixed seed, thousands of variants), through every entry
//! point: errors or results, never a panic. Also every input in `tests/regressions/` (crashes
//! found by `fuzz/`, kept as regression cases).

mod common;

use std::path::PathBuf;

use common::*;

/// Calls every entry point on `data`.
fn exercise(data: &[u8]) {
    let _ = fatbin::detect_image_kind(data);
    let _ = fatbin::parse_wrapper(data);
    let _ = fatbin::container_len(data);
    let _ = fatbin::elf_image_len(data);
    let _ = fatbin::parse_cubin(data);
    let _ = fatbin::parse_ptx(data);
    for f in [
        fatbin::Fatbin::parse,
        fatbin::Fatbin::from_containers,
        fatbin::Fatbin::from_host_elf,
        fatbin::Fatbin::from_cubin,
        fatbin::Fatbin::from_ptx,
    ] {
        if let Ok(fb) = f(data) {
            for e in fb.entries() {
                let _ = e.kernels();
            }
            let _ = fb.loadable_entries();
            for sm in [75, 80, 86, 90, 100, 120] {
                let _ = fb.select(sm);
                let _ = fb.kernels_for_sm(sm);
                let _ = fb.kernel("no_params", sm);
            }
        }
    }
    streaming_agrees(data);
}

/// The streaming path ([`fatbin::StreamIndex`], [`fatbin::Decoder`]) reads the same headers,
/// kernels and errors from `data` as [`fatbin::Fatbin`] does.
fn streaming_agrees(data: &[u8]) {
    let stream = fatbin::StreamIndex::read(data);
    let fb = match fatbin::Fatbin::parse(data) {
        Ok(fb) => fb,
        Err(e) => {
            assert_eq!(stream.err(), Some(e), "the same error from both indexes");
            return;
        }
    };
    let stream = stream.unwrap_or_else(|e| panic!("Fatbin::parse succeeds, StreamIndex: {e}"));
    assert_eq!(stream.input_kind(), fb.input_kind());
    assert_eq!(stream.containers().len(), fb.containers().len());
    assert_eq!(stream.entries().len(), fb.entries().len());
    let head = |e: &fatbin::Entry<'_>| {
        (
            e.container,
            e.offset,
            e.kind,
            e.header_size,
            e.sm,
            e.flags,
            e.version,
            e.identifier.clone(),
            e.compression,
            e.compressed_size,
            e.uncompressed_size,
        )
    };
    let mut decoder = fatbin::Decoder::new();
    for (i, (s, f)) in stream.entries().iter().zip(fb.entries()).enumerate() {
        assert_eq!(head(s), head(f), "entry {i}");
        assert_eq!(decoder.kernels(data, &stream, i), f.kernels(), "entry {i}");
    }
    let indices = |v: Vec<&fatbin::Entry<'_>>| v.iter().map(|e| e.offset).collect::<Vec<_>>();
    let offsets = |v: Vec<usize>| {
        v.iter()
            .map(|&i| stream.entries()[i].offset)
            .collect::<Vec<_>>()
    };
    assert_eq!(offsets(stream.loadable()), indices(fb.loadable_entries()));
    for sm in [75, 90, 120] {
        assert_eq!(offsets(stream.select(sm)), indices(fb.select(sm)));
    }
}

/// xorshift64*: a fixed-seed generator, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate_all(name: &str, data: &[u8], flips: usize) -> usize {
    let mut count = 0;
    // Truncations: every length up to 512, then about 300 lengths spread over the rest.
    let step = (data.len() / 300).max(1);
    let lengths = (0..data.len().min(512)).chain((512..data.len()).step_by(step));
    for len in lengths {
        exercise(&data[..len]);
        count += 1;
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ data.len() as u64);
    let mut buf = data.to_vec();
    for _ in 0..flips {
        buf.copy_from_slice(data);
        for _ in 0..1 + rng.below(8) {
            // Half of the flips land in the first 256 bytes, where the headers are.
            let at = if rng.below(2) == 0 {
                rng.below(buf.len().min(256))
            } else {
                rng.below(buf.len())
            };
            if let Some(b) = buf.get_mut(at) {
                *b ^= 1 << rng.below(8);
            }
        }
        exercise(&buf);
        count += 1;
    }
    eprintln!("{name}: {} bytes, {count} variants", data.len());
    count
}

fn real_inputs() -> Vec<(String, PathBuf)> {
    let Some(t) = tools() else { return Vec::new() };
    let mut v = Vec::new();
    for src in ["layouts_basic.cu", "layouts_templates.cu"] {
        for (label, flags, file) in [
            (
                "zstd",
                &["-fatbin", "-arch=sm_90", "-Xfatbin", "-compress-all"][..],
                "k.fatbin",
            ),
            (
                "lz4",
                &[
                    "-fatbin",
                    "-arch=sm_90",
                    "--compress-mode=speed",
                    "-Xfatbin",
                    "-compress-all",
                ][..],
                "k.fatbin",
            ),
            (
                "plain",
                &["-fatbin", "-arch=sm_90", "-Xfatbin", "-compress=false"][..],
                "k.fatbin",
            ),
            (
                "multi",
                &[
                    "-fatbin",
                    "-gencode",
                    "arch=compute_80,code=sm_80",
                    "-gencode",
                    "arch=compute_90,code=[sm_90,compute_90]",
                ][..],
                "k.fatbin",
            ),
            ("cubin", &["-cubin", "-arch=sm_90"][..], "k.cubin"),
            ("ptx", &["-ptx", "-arch=compute_90"][..], "k.ptx"),
            ("rdc object", &["-c", "-rdc=true", "-arch=sm_90"][..], "k.o"),
        ] {
            v.push((format!("{src} {label}"), nvcc(&t, src, flags, file)));
        }
        if let Some(c) = cu12_cubin(&t, src) {
            v.push((format!("{src} cu12 cubin"), c));
        }
    }
    v.push((
        "executable".into(),
        nvcc(
            &t,
            "layouts_templates.cu",
            &["-arch=sm_90", "-cudart", "shared"],
            "a.out",
        ),
    ));
    v
}

#[test]
fn real_inputs_parse_cleanly() {
    for (name, path) in real_inputs() {
        let data = std::fs::read(&path).unwrap();
        let fb = fatbin::Fatbin::parse(&data).unwrap_or_else(|e| panic!("{name}: {e}"));
        for e in fb.entries() {
            let ks = e
                .kernels()
                .unwrap_or_else(|err| panic!("{name}: entry at {:#x}: {err}", e.offset));
            assert!(
                !ks.is_empty() || e.raw_payload.len() < 2048,
                "{name}: entry without kernels"
            );
        }
    }
}

#[test]
fn truncated_and_bit_flipped_inputs_never_panic() {
    let mut total = 0;
    for (name, path) in real_inputs() {
        let data = std::fs::read(&path).unwrap();
        let flips = if data.len() > 200_000 { 300 } else { 1000 };
        total += mutate_all(&name, &data, flips);
    }
    eprintln!("{total} variants in all");
}

#[test]
fn regression_inputs_never_panic() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        exercise(&std::fs::read(&path).unwrap());
        n += 1;
    }
    eprintln!("{n} regression inputs");
}

#[test]
fn hand_made_inputs() {
    let mut container = Vec::new();
    container.extend(0xBA55_ED50u32.to_le_bytes());
    container.extend(1u16.to_le_bytes());
    container.extend(16u16.to_le_bytes());
    container.extend(u64::MAX.to_le_bytes()); // size overflows with the header
    for data in [
        &[][..],
        &[0u8; 64][..],
        &container[..],
        b"\x7fELF",
        b"\x7fELF\x02\x01\x01\x41",
        b".version 9.0\n.target sm_90\n.entry k(",
        b".entry",
        b".entry k(.param .align 0 .b8 x[4294967295], .param .u64 y)\n{\n}",
        b".entry k(.param .b128 x[4294967295])\n{\n}",
    ] {
        exercise(data);
    }
    assert!(matches!(
        fatbin::container_len(&container),
        Err(fatbin::Error::InvalidField { .. })
    ));
}
