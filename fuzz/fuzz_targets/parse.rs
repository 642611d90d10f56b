//! Every entry point of the fatbin crate on arbitrary bytes: wrapper and container headers,
//! image detection, host ELF / container / cubin / PTX indexing, decompression of every entry,
//! cubin `.nv.info` and PTX `.entry` parsing, image choice, the per-SM cache and the streaming
//! index and decoder.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fatbin::detect_image_kind(data);
    let _ = fatbin::parse_wrapper(data);
    let _ = fatbin::container_len(data);
    let _ = fatbin::elf_image_len(data);
    let _ = fatbin::parse_cubin(data);
    let _ = fatbin::parse_ptx(data);
    if let Ok(fb) = fatbin::Fatbin::parse(data) {
        for e in fb.entries() {
            let _ = e.kernels();
        }
        for sm in [80, 86, 90, 120] {
            let _ = fb.kernels_for_sm(sm);
            let _ = fb.kernel("k", sm);
        }
    }
    // The streaming path: headers through `ReadAt`, entries through one reused decoder.
    if let Ok(index) = fatbin::StreamIndex::read(data) {
        let mut decoder = fatbin::Decoder::new();
        for i in 0..index.entries().len() {
            let _ = decoder.kernels(data, &index, i);
        }
        let _ = index.select(90);
    }
});
