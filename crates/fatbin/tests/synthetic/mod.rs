//! Synthetic fatbins for the streaming tests (no nvcc needed).

/// A minimal cubin (an ELF64 header for EM_CUDA, sm_`sm`, no sections) padded with
/// zeros to `size` bytes.
fn cubin(sm: u32, size: usize) -> Vec<u8> {
    let mut e = vec![0u8; size.max(64)];
    e[..4].copy_from_slice(b"\x7fELF");
    e[4] = 2; // ELF64
    e[5] = 1; // little-endian
    e[6] = 1;
    e[7] = 0x41; // CUDA 13 OSABI
    e[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e[18..20].copy_from_slice(&190u16.to_le_bytes()); // EM_CUDA
    e[20..24].copy_from_slice(&1u32.to_le_bytes());
    e[48..52].copy_from_slice(&(sm << 8).to_le_bytes()); // e_flags
    e[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    e[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    e
}

/// One container per group of `per_container` entries, each a zstd-compressed cubin of
/// `size` bytes, SMs cycling through 75, 80, 90.
pub fn synthetic_fatbin(entries: usize, per_container: usize, size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in (0..entries).collect::<Vec<_>>().chunks(per_container) {
        let mut body = Vec::new();
        for &i in chunk {
            let sm = [75, 80, 90][i % 3];
            let image = cubin(sm, size);
            let mut z = zstd::bulk::compress(&image, 3).unwrap();
            let compressed = z.len();
            z.resize(compressed.div_ceil(8) * 8, 0);
            let mut h = vec![0u8; 0x40];
            h[0..2].copy_from_slice(&2u16.to_le_bytes()); // ELF
            h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
            h[4..8].copy_from_slice(&0x40u32.to_le_bytes());
            h[8..16].copy_from_slice(&(z.len() as u64).to_le_bytes());
            h[0x10..0x14].copy_from_slice(&(compressed as u32).to_le_bytes());
            h[0x1c..0x20].copy_from_slice(&sm.to_le_bytes());
            h[0x28..0x30].copy_from_slice(&(0x8000u64 | 0x11).to_le_bytes());
            h[0x38..0x40].copy_from_slice(&(image.len() as u64).to_le_bytes());
            body.extend(h);
            body.extend(z);
        }
        out.extend(0xBA55_ED50u32.to_le_bytes());
        out.extend(1u16.to_le_bytes());
        out.extend(16u16.to_le_bytes());
        out.extend((body.len() as u64).to_le_bytes());
        out.extend(body);
        out.extend([0u8; 8]); // padding between containers
    }
    out
}
