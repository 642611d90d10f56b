//! Helpers shared by the integration tests.
#![allow(dead_code)]

use ckpt::*;

/// A fixed description.
pub fn meta() -> ImageMetadata {
    ImageMetadata {
        process: ProcessInfo {
            pid: 4242,
            executable: "/usr/bin/python3.12".into(),
            hostname: "gpu-node-7".into(),
            cudaw_version: "0.1.0".into(),
            created_unix_nanos: 1_790_000_000_123_456_789,
            cuda_runtime_major: 13,
            addressing: Addressing::Mapped,
        },
        gpu: GpuInfo {
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: "GPU-8d3a2c1e-0f4b-4e6d-9a7c-1b2c3d4e5f60".into(),
            compute_capability_major: 9,
            compute_capability_minor: 0,
            total_memory: 85_029_158_912,
            ordinal: Some(3),
        },
        other_gpus: Vec::new(),
    }
}

/// splitmix64: a fixed-seed generator for contents and corruption offsets.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Deterministic contents of allocation `id` at `offset..offset + buf.len()`.
pub fn fill(id: u64, offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let x = offset + i as u64;
        *b = (x.wrapping_mul(31) ^ id.wrapping_mul(0x9e37) ^ (x >> 8)) as u8;
    }
}

/// The whole contents of `r`.
pub fn contents(r: &AllocationRecord) -> Vec<u8> {
    let mut v = vec![0; r.size as usize];
    fill(r.id, 0, &mut v);
    v
}

/// A small image: three allocations (one empty), chunk size 64.
pub fn small_table() -> Vec<AllocationRecord> {
    vec![
        AllocationRecord {
            id: 7,
            base: 0x7f00_0000_0000,
            size: 300,
            order: 0,
            tag: 1,
            handle: None,
            device: 3,
        },
        AllocationRecord {
            id: 3,
            base: 0x7f00_0000_1000,
            size: 0,
            order: 1,
            tag: 2,
            handle: None,
            device: 3,
        },
        AllocationRecord {
            id: 9,
            base: 0x7f00_0000_0200,
            size: 129,
            order: 2,
            tag: 3,
            handle: None,
            device: 3,
        },
    ]
}

/// [`small_table`] and two ranges of one driver handle (format 1.2).
#[allow(dead_code)]
pub fn table_with_handles() -> Vec<AllocationRecord> {
    let mut prop = [0u8; PROP_LEN];
    prop[0] = 1; // CU_MEM_ALLOCATION_TYPE_PINNED
    prop[8] = 1; // CU_MEM_LOCATION_TYPE_DEVICE
    let mut t = small_table();
    for (i, (base, size, offset)) in [
        (0x7f00_0010_0000u64, 256u64, 0u64),
        (0x7f00_0020_0000, 64, 256),
    ]
    .into_iter()
    .enumerate()
    {
        t.push(AllocationRecord {
            id: 0xcda0_0000_0000_0001 | (i as u64) << 48,
            base,
            size,
            order: 1,
            tag: 0,
            handle: Some(HandleRange {
                handle: 0xcda0_0000_0000_0001,
                handle_size: 320,
                offset,
                prop,
            }),
            device: 3,
        });
    }
    t
}

/// Writes `table` (contents from [`fill`]) whole.
pub fn image(table: &[AllocationRecord], chunk_size: u64) -> Vec<u8> {
    let mut w = ImageWriter::begin(Vec::new(), &meta(), table, WriterOptions { chunk_size })
        .expect("begin");
    for r in table {
        w.write_allocation(r.id, &contents(r)).expect("write");
    }
    w.finish().expect("finish")
}

/// Opens and verifies `bytes`, reads every allocation; the first error.
pub fn open_verify_read(bytes: &[u8]) -> Result<(), ImageError> {
    let mut r = ImageReader::open(std::io::Cursor::new(bytes))?;
    r.verify()?;
    let ids: Vec<(u64, u64)> = r
        .allocations()
        .iter()
        .map(|e| (e.record.id, e.record.size))
        .collect();
    for (id, size) in ids {
        let mut buf = vec![0; size as usize];
        r.read_allocation(id, &mut buf)?;
    }
    Ok(())
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Recomputes the header checksum, the metadata checksum and the trailer digest of an image
/// edited by a test (format 1.0 header), so that only the edit itself is seen.
pub fn reseal(img: &mut [u8]) {
    use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};
    let meta_off = le64(img, 32) as usize;
    let meta_len = le64(img, 40) as usize;
    let data_off = le64(img, 48) as usize;
    let trailer_off = le64(img, 64) as usize;
    let ms = xxh3_64(&img[meta_off..meta_off + meta_len]);
    img[88..96].copy_from_slice(&ms.to_le_bytes());
    let hs = xxh3_64(&img[..120]);
    img[120..128].copy_from_slice(&hs.to_le_bytes());
    let mut d = Xxh3Default::new();
    d.update(&img[..128]);
    d.update(&img[meta_off..meta_off + meta_len]);
    let mut at = data_off;
    // Walks the chunks as laid out (stops where a test's edit makes that impossible).
    while at < trailer_off && at + 24 <= img.len() {
        let len = le64(img, at + 16) as usize;
        let Some(sum) = img.get(at + 24 + len..at + 32 + len) else {
            break;
        };
        d.update(sum);
        at += 32 + len;
    }
    let digest = d.digest();
    img[trailer_off + 16..trailer_off + 24].copy_from_slice(&digest.to_le_bytes());
}
