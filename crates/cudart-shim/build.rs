//! Generates the shim's exports from the real runtime's export lists (`exports/`), the single
//! source of truth: the dispatch table over the union of every major's names, one assembly
//! trampoline per export of the selected major (an in-flight one for the exports that can
//! enqueue device work), and the linker version script naming the
//! SONAME's version node (`shim-build` writes all three). Nothing here is edited by hand.

use shim_build::{
    in_flight_support_traced, in_group, link_cdylib, marked_by_trampoline, names_rs, read_list,
    read_wrapped, slow_path, trace_fast_path, trampolines, version_script, wrapped_rs, GateWord,
    InFlight,
};

/// `gate::TRACING`: the gate word's value when tracing takes the assembly fast path.
const TRACING: u32 = 4;
use std::collections::BTreeSet;
use std::env;
use std::fs;
use std::path::PathBuf;

const MAJORS: [(&str, &str, &str); 3] = [
    ("cuda11", "cudart-11.8.exports", "libcudart.so.11.0"),
    ("cuda12", "cudart-12.9.exports", "libcudart.so.12"),
    ("cuda13", "cudart-13.5.exports", "libcudart.so.13"),
];

/// cudaw's own exports beside the runtime's: the hook table the driver shim
/// (`libcuda.so.1`) looks up to share this library's gate and state, its handle table and
/// its memory table and its tracing table; and the switch a program may call to turn
/// tracing on and off while it runs.
const OWN_EXPORTS: [&str; 5] = [
    "cudaw_runtime_handles_v1",
    "cudaw_runtime_hooks_v1",
    "cudaw_runtime_memory_v1",
    "cudaw_runtime_trace_v1",
    "cudaw_trace_active_v1",
];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let exports_dir = manifest.join("exports");

    let selected: Vec<_> = MAJORS
        .iter()
        .filter(|(feat, _, _)| env::var(format!("CARGO_FEATURE_{}", feat.to_uppercase())).is_ok())
        .collect();
    assert!(
        selected.len() == 1,
        "cudart-shim: enable exactly one of the features cuda11, cuda12, cuda13 (got {})",
        selected.len()
    );
    let (_, sel_file, soname) = *selected[0];

    let mut all = BTreeSet::new();
    for (_, file, _) in MAJORS {
        all.extend(read_list(&exports_dir.join(file)));
    }
    let all: Vec<String> = all.into_iter().collect();
    let exported = read_list(&exports_dir.join(sel_file));

    // The one list of wrapped calls and their groups (`exports/wrapped.txt`).
    let wrapped = read_wrapped(&exports_dir.join("wrapped.txt"), &GROUPS, &all);
    fs::write(out.join("wrapped.rs"), wrapped_rs(&wrapped, &GROUPS)).unwrap();
    // The launches: they can enqueue device work, but cudaw always wraps them, and the
    // wrappers mark them in flight themselves (`inflight::marked`, or the wrapped calls'
    // count), so their trampolines are the plain kind: the return goes straight back to
    // the caller instead of through a thunk.
    let marked_by_wrapper = in_group(&wrapped, "launch");

    // The exports whose arguments all travel in registers (scripts/gen-register-args.py):
    // the tracing fast path calls them from its own frame (shim-build's TRACE_DIRECT).
    let register_args: BTreeSet<String> = read_list(&exports_dir.join("register-args.txt"))
        .into_iter()
        .collect();
    let direct: Vec<String> = all
        .iter()
        .filter(|n| register_args.contains(*n))
        .map(|n| format!("idx::{n}"))
        .collect();
    let extra = format!(
        "/// The SONAME (and version node) of this build.\npub const SONAME: &str = {soname:?};\n\
         /// The exports whose arguments all travel in registers (`exports/register-args.txt`).\n\
         pub const REGISTER_ARGS: [usize; {}] = [{}];\n",
        direct.len(),
        direct.join(", ")
    );
    fs::write(
        out.join("names.rs"),
        names_rs(
            &all,
            exported.len(),
            "runtime export of every supported major",
            &extra,
        ),
    )
    .unwrap();
    fs::write(
        out.join("trampolines.s"),
        trampolines(
            &all,
            &exported,
            GateWord::Direct,
            None,
            Some(InFlight {
                prefix: "cudaw_rt",
                marked: &|name| marked_by_trampoline(name, &marked_by_wrapper),
            }),
            Some(TRACING),
        ),
    )
    .unwrap();
    fs::write(out.join("slow.s"), slow_path()).unwrap();
    fs::write(
        out.join("inflight.s"),
        in_flight_support_traced("cudaw_rt", Some((TRACING, "cudaw_rt_trace_enter"))),
    )
    .unwrap();
    fs::write(out.join("trace.s"), trace_fast_path("cudaw_rt", TRACING)).unwrap();
    let mut global = exported.clone();
    global.extend(OWN_EXPORTS.iter().map(|s| (*s).to_owned()));
    link_cdylib(&out, &version_script(Some(soname), &global), soname);
    println!("cargo:rerun-if-changed=build.rs");
}

/// The groups of `exports/wrapped.txt` (described there).
const GROUPS: [&str; 4] = ["always", "launch", "traced", "timed"];
