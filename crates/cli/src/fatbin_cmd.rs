//! `cudaw fatbin FILE [--json] [--sm N]`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;

use crate::failure::{fail, JsonPrinted, Kind};
use crate::out::StdoutClosed;
use fatbin::{decode_in_order, Entry, EntryKind, KernelInfo, StreamIndex};

/// Arguments of `cudaw fatbin`.
#[derive(Debug, clap::Args)]
#[command(
    long_about = "List every kernel in a CUDA binary with its parameter layout.\n\n\
FILE may be a program or shared library built by nvcc (its .nv_fatbin and __nv_relfatbin \
sections are read), an -rdc object, a raw fatbin (nvcc -fatbin; several concatenated \
containers are fine), a cubin (nvcc -cubin) or PTX text (nvcc -ptx).\n\n\
Each kernel is listed once per image that contains it: one row per kernel per cubin \
(source elf, SM of the cubin) or PTX entry (source ptx, SM = the PTX's compute_XX target). \
OFFSETS shows each parameter as ordinal:offset+size, in bytes.\n\n\
The listing is streamed: each image is decompressed, read and dropped in turn, on several \
threads when there are cores for them, and printed in file order as it is produced; memory \
stays at a few images, whatever the file's size. An image found corrupt part-way stops the \
listing with an error (exit status 1); under --json the object printed so far is closed \
with \"ok\":false, \"kind\" and \"error\" beside \"kernels\".",
    after_help = "Examples:\n  \
cudaw fatbin ./vector_add                 all kernels of all images\n  \
cudaw fatbin ./vector_add --sm 90         what the driver would load on an sm_90 GPU\n  \
cudaw fatbin libtorch_cuda.so --sm 90 --json | jq '.kernels | length'\n\n\
JSON shape (--json): {\"kernels\": [{\"name\": MANGLED, \"demangled\": TEXT, \"sm\": 90, \
\"source\": \"elf\"|\"ptx\", \"param_bytes\": N, \"params\": [{\"ordinal\": 0, \"offset\": 0, \
\"size\": 8}, ...]}, ...]}. \"sm\" is null only for PTX text without a .target line."
)]
pub struct Args {
    /// The binary to read.
    pub file: PathBuf,
    /// Print exactly one JSON object instead of a table (on failure,
    /// {"ok":false,"kind":KIND,"error":MESSAGE}).
    #[arg(long)]
    pub json: bool,
    /// Only the images the driver would run on this SM (e.g. 90 for sm_90): per container,
    /// an exact cubin, else an older-minor cubin of the same major, else the newest PTX.
    #[arg(long, value_name = "N")]
    pub sm: Option<u32>,
    /// Threads decoding images (default: the cores this process may run on, at most 8).
    /// The output is the same for any number.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// After the listing, print on standard error where the time went (reading,
    /// decompressing, parsing, formatting, writing) and the most memory the decoders held.
    #[arg(long)]
    pub stats: bool,
}

/// Runs the subcommand, printing to stdout as the listing is produced.
pub fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let path = args.file.display();
    let cannot_read =
        |e: &dyn std::fmt::Display| fail(Kind::Io, format!("{path}: cannot read: {e}"));
    let file = std::fs::File::open(&args.file).map_err(|e| cannot_read(&e))?;
    let regular = file.metadata().map_err(|e| cannot_read(&e))?.is_file();
    // A pipe or device cannot be read at offsets: read it whole.
    let whole = if regular {
        None
    } else {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(|e| cannot_read(&e))?;
        Some(bytes)
    };
    let src: &dyn fatbin::ReadAt = match &whole {
        Some(bytes) => bytes,
        None => &file,
    };
    let index = StreamIndex::read(src).map_err(|e| match e {
        fatbin::Error::Io { .. } => cannot_read(&e),
        _ => fail(
            Kind::BadInput,
            format!("{path}: no usable device code: {e}"),
        ),
    })?;
    let indexed = started.elapsed();
    let indices = match args.sm {
        Some(sm) => index.select(sm),
        None => index.loadable(),
    };
    let threads = args.threads.map_or_else(default_threads, usize::from);

    let stdout = std::io::stdout();
    let mut out = Output {
        w: std::io::BufWriter::with_capacity(1 << 20, stdout.lock()),
        json: args.json,
        started: false,
        kernels: 0,
        write_secs: 0.0,
    };
    if !args.json {
        out.put(summary(&index, args.sm).as_bytes())?;
    }
    let names = Names::default();
    let decoded = decode_in_order(
        src,
        &index,
        &indices,
        threads,
        |(): &mut (), entry, kernels| format_entry(&names, entry, kernels, args.json),
        |formatted: Formatted| {
            let t = Instant::now();
            let r = out.take(formatted, &path);
            out.write_secs += t.elapsed().as_secs_f64();
            r
        },
    );
    let stats = match decoded {
        Ok(stats) => stats,
        Err(e) if crate::out::stdout_closed(&e) => return Err(e),
        Err(e) => return Err(out.fail(e)),
    };
    out.finish()?;
    if args.stats {
        let t = stats.timings;
        errln!(
            "cudaw fatbin: {} entries, {} kernels, {:.0} MB decompressed, {} thread(s); \
             wall {:.3} s: index {:.3} s; summed over threads: read {:.3} s, decompress {:.3} s, \
             parse {:.3} s, format {:.3} s; writing {:.3} s; at most {} image(s) at once, \
             decoder buffers at most {:.1} MB",
            stats.entries,
            out.kernels,
            t.decompressed_bytes as f64 / 1e6,
            stats.threads.max(1),
            started.elapsed().as_secs_f64(),
            indexed.as_secs_f64(),
            t.read,
            t.decompress,
            t.parse,
            format_secs(),
            out.write_secs,
            stats.peak_images,
            stats.peak_buffer_bytes as f64 / 1e6,
        );
    }
    Ok(())
}

/// Decoding threads by default: the cores this process may run on, at most 8.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// The first line of the table.
fn summary(index: &StreamIndex, sm: Option<u32>) -> String {
    let entries = index.entries();
    let count = |kind| entries.iter().filter(|e| e.kind == kind).count();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} container(s), {} entr{} ({} cubin, {} PTX){}",
        index.containers().len(),
        entries.len(),
        if entries.len() == 1 { "y" } else { "ies" },
        count(EntryKind::Elf),
        count(EntryKind::Ptx),
        sm.map(|n| format!(", showing what sm_{n} runs"))
            .unwrap_or_default(),
    );
    let _ = writeln!(
        s,
        "{:<5} {:<4} {:>6} {:>6}  KERNEL (mangled name)  OFFSETS",
        "SM", "SRC", "PARAMS", "BYTES"
    );
    s
}

/// One entry's kernels, formatted on the worker that decoded them; or why it failed.
type Formatted = std::result::Result<(Vec<u8>, usize), String>;

/// Seconds spent formatting, over all threads (in microseconds).
static FORMAT_MICROS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn format_secs() -> f64 {
    FORMAT_MICROS.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6
}

/// Demangled names of the containers being listed, shared by the decoding threads: a
/// container's images (one per SM) hold the same kernels, so each name is demangled (and
/// escaped for JSON) once per container. Containers well behind the one being formatted
/// are forgotten.
#[derive(Default)]
struct Names(std::sync::Mutex<NameCache>);

type NameCache = HashMap<usize, HashMap<String, Arc<Name>, foldhash::fast::RandomState>>;

/// A kernel name as the listing prints it.
struct Name {
    demangled: String,
    /// `"demangled":…,"name":…` (JSON, escaped), written as is into every item.
    json: Vec<u8>,
}

impl Name {
    fn new(mangled: &str) -> Name {
        let demangled = demangle(mangled);
        let mut json = Vec::with_capacity(demangled.len() + mangled.len() + 24);
        json.extend_from_slice(b"\"demangled\":");
        // Writing a string to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut json, &demangled);
        json.extend_from_slice(b",\"name\":");
        let _ = serde_json::to_writer(&mut json, mangled);
        Name { demangled, json }
    }
}

impl Names {
    fn get(&self, container: usize, name: &str) -> Arc<Name> {
        let lock = || self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = lock().get(&container).and_then(|c| c.get(name)) {
            return Arc::clone(d);
        }
        let d = Arc::new(Name::new(name));
        let mut all = lock();
        all.retain(|&c, _| c + 2 >= container);
        all.entry(container)
            .or_default()
            .insert(name.to_owned(), Arc::clone(&d));
        d
    }
}

fn format_entry(
    names: &Names,
    entry: &Entry<'_>,
    kernels: fatbin::Result<Vec<KernelInfo>>,
    json: bool,
) -> Formatted {
    let t = Instant::now();
    let kernels = kernels.map_err(|e| {
        format!(
            "corrupt {:?} entry for sm_{} at offset {:#x}: {e}",
            entry.kind, entry.sm, entry.offset
        )
    })?;
    let mut buf = Vec::with_capacity(kernels.len() * 512);
    for (n, k) in kernels.iter().enumerate() {
        let name = names.get(entry.container, &k.name);
        if json {
            if n > 0 {
                buf.push(b',');
            }
            json_item(&mut buf, k, &name);
        } else {
            table_row(&mut buf, k, &name.demangled);
        }
    }
    FORMAT_MICROS.fetch_add(
        t.elapsed().as_micros() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    Ok((buf, kernels.len()))
}

/// The demangled form of a mangled name (the name itself for `extern "C"` kernels).
pub fn demangle(name: &str) -> String {
    cudaw_demangle::demangle(name)
}

/// One kernel of `--json`: `{"demangled":…,"name":…,"param_bytes":N,"params":[{"offset":N,
/// "ordinal":N,"size":N},…],"registers":N|null,"sm":N|null,"source":"elf"|"ptx"}`, keys
/// sorted, no spaces: what `serde_json` printed for it before (the tests compare the two),
/// written by hand because 130,000 kernels of PyTorch spent a tenth of the listing there.
fn json_item(buf: &mut Vec<u8>, k: &KernelInfo, name: &Name) {
    let mut num = itoa::Buffer::new();
    let mut opt = |buf: &mut Vec<u8>, key: &[u8], v: Option<u32>| {
        buf.extend_from_slice(key);
        match v {
            Some(v) => buf.extend_from_slice(num.format(v).as_bytes()),
            None => buf.extend_from_slice(b"null"),
        }
    };
    buf.push(b'{');
    buf.extend_from_slice(&name.json);
    opt(buf, b",\"param_bytes\":", Some(k.param_bytes));
    buf.extend_from_slice(b",\"params\":[");
    for (i, p) in k.params.iter().enumerate() {
        opt(
            buf,
            if i == 0 {
                b"{\"offset\":"
            } else {
                b",{\"offset\":"
            },
            Some(p.offset),
        );
        opt(buf, b",\"ordinal\":", Some(p.ordinal));
        opt(buf, b",\"size\":", Some(p.size));
        buf.push(b'}');
    }
    buf.push(b']');
    opt(buf, b",\"registers\":", k.registers);
    opt(buf, b",\"sm\":", k.sm);
    buf.extend_from_slice(b",\"source\":");
    // "elf" or "ptx": nothing to escape, but no reason to assume it.
    let _ = serde_json::to_writer(&mut *buf, k.source.as_str());
    buf.push(b'}');
}

fn table_row(buf: &mut Vec<u8>, k: &KernelInfo, demangled: &str) {
    let sm = k.sm.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let mut offsets = String::new();
    for (i, p) in k.params.iter().enumerate() {
        let sep = if i > 0 { " " } else { "" };
        let _ = write!(offsets, "{sep}{}:{}+{}", p.ordinal, p.offset, p.size);
    }
    let _ = write!(
        buf,
        "{:<5} {:<4} {:>6} {:>6}  ",
        sm,
        k.source.as_str(),
        k.params.len(),
        k.param_bytes,
    );
    if demangled == k.name {
        let _ = write!(buf, "{}", k.name);
    } else {
        let _ = write!(buf, "{demangled}  ({})", k.name);
    }
    let _ = writeln!(buf, "  [{offsets}]");
}

/// Standard output as the listing is written.
struct Output<W: std::io::Write> {
    w: W,
    json: bool,
    /// Whether `{"kernels":[` is out.
    started: bool,
    kernels: usize,
    write_secs: f64,
}

impl<W: std::io::Write> Output<W> {
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.w
            .write_all(bytes)
            .map_err(|e| anyhow::Error::new(StdoutClosed(e)))
    }

    /// One entry's kernels, or the first failure.
    fn take(&mut self, formatted: Formatted, path: &std::path::Display<'_>) -> Result<()> {
        let (bytes, n) = formatted.map_err(|e| fail(Kind::BadInput, format!("{path}: {e}")))?;
        if n == 0 {
            return Ok(());
        }
        if self.json {
            let sep: &[u8] = if self.started {
                b","
            } else {
                b"{\"kernels\":["
            };
            self.put(sep)?;
            self.started = true;
        }
        self.kernels += n;
        self.put(&bytes)
    }

    /// The end of a complete listing.
    fn finish(&mut self) -> Result<()> {
        let tail = if !self.json {
            format!("{} kernel image(s)\n", self.kernels)
        } else if self.started {
            "]}\n".to_owned()
        } else {
            "{\"kernels\":[]}\n".to_owned()
        };
        self.put(tail.as_bytes())?;
        self.w
            .flush()
            .map_err(|e| anyhow::Error::new(StdoutClosed(e)))
    }

    /// A listing stopped by `e` part-way. Under `--json`, once the object has begun, it is
    /// closed with the failure in it (one object on standard output, as always).
    fn fail(&mut self, e: anyhow::Error) -> anyhow::Error {
        if self.json && self.started {
            let kind = crate::failure::kind_of(&e);
            let message = format!("{e:#}");
            let tail = format!(
                "],\"ok\":false,\"kind\":{},\"error\":{}}}\n",
                serde_json::Value::from(kind.as_str()),
                serde_json::Value::from(message)
            );
            if let Err(closed) = self.put(tail.as_bytes()).and_then(|()| {
                self.w
                    .flush()
                    .map_err(|e| anyhow::Error::new(StdoutClosed(e)))
            }) {
                return closed;
            }
            return e.context(JsonPrinted);
        }
        // What was listed so far stays; the failure goes to standard error.
        let _ = self.w.flush();
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fatbin::{ParamInfo, Source};

    /// What `serde_json` printed for a kernel before `json_item` wrote it by hand.
    #[derive(serde::Serialize)]
    struct SerdeKernel<'a> {
        demangled: &'a str,
        name: &'a str,
        param_bytes: u32,
        params: Vec<SerdeParam>,
        registers: Option<u32>,
        sm: Option<u32>,
        source: &'a str,
    }

    #[derive(serde::Serialize)]
    struct SerdeParam {
        offset: u32,
        ordinal: u32,
        size: u32,
    }

    fn by_serde(k: &KernelInfo, demangled: &str) -> Vec<u8> {
        serde_json::to_vec(&SerdeKernel {
            demangled,
            name: &k.name,
            param_bytes: k.param_bytes,
            params: k
                .params
                .iter()
                .map(|p| SerdeParam {
                    offset: p.offset,
                    ordinal: p.ordinal,
                    size: p.size,
                })
                .collect(),
            registers: k.registers,
            sm: k.sm,
            source: k.source.as_str(),
        })
        .unwrap()
    }

    #[test]
    fn a_kernel_prints_as_serde_json_printed_it() {
        let param = |ordinal, offset, size| ParamInfo {
            ordinal,
            offset,
            size,
        };
        let kernels = [
            KernelInfo {
                name: "_Z6vecAddPKfS0_Pfi".into(),
                params: vec![
                    param(0, 0, 8),
                    param(1, 8, 8),
                    param(2, 16, 8),
                    param(3, 24, 4),
                ],
                param_bytes: 28,
                sm: Some(90),
                source: Source::Elf,
                registers: Some(u32::MAX),
                ..KernelInfo::default()
            },
            KernelInfo {
                name: "no_params".into(),
                source: Source::Ptx,
                ..KernelInfo::default()
            },
            // Names a demangler would never give, with what JSON must escape.
            KernelInfo {
                name: "quote\"back\\slash\u{1}tab\tnon-ascii é".into(),
                params: vec![param(7, 4_000_000_000, 0)],
                param_bytes: u32::MAX,
                sm: Some(0),
                registers: Some(0),
                ..KernelInfo::default()
            },
        ];
        for k in &kernels {
            let name = Name::new(&k.name);
            let mut mine = Vec::new();
            json_item(&mut mine, k, &name);
            assert_eq!(
                String::from_utf8_lossy(&mine),
                String::from_utf8_lossy(&by_serde(k, &demangle(&k.name)))
            );
        }
        assert_eq!(
            Name::new("_Z6vecAddPKfS0_Pfi").demangled,
            "vecAdd(float const*, float const*, float*, int)"
        );
    }
}
