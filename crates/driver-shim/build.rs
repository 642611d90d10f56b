//! Generates the driver shim's exports from the driver's function list,
//! `data/cuda-13.driver-functions` (made by `scripts/gen-driver-functions.py` from the
//! CUDA headers and a real driver's export list): the names table, one gate-testing
//! trampoline per driver function (an in-flight one for those that can enqueue device work) with a table of their addresses (what
//! `cuGetProcAddress` hands out), the slow path, and the version script (unversioned, as
//! NVIDIA's driver exports its functions; SONAME `libcuda.so.1`). Nothing is edited by hand.

use shim_build::{
    in_flight_support, in_group, link_cdylib, marked_by_trampoline, names_rs, read_list,
    read_wrapped, slow_path, trampolines, version_script, wrapped_rs, GateWord, InFlight,
};
use std::env;
use std::fs;
use std::path::PathBuf;

/// cudaw's own exports beside the driver's: the real driver's path (asked by cudaw's
/// `driver` crate so that its calls reach the real driver), the launch counts and the
/// kernel layouts of driver-loaded modules, the tracing switch the runtime shim calls, and
/// the thread's launch count the runtime shim reads (to see that its launches pass here),
/// and the process's total of launches (its status's `launches`).
const OWN_EXPORTS: [&str; 6] = [
    "cudaw_driver_shim_real_path",
    "cudaw_driver_launch_counts_v1",
    "cudaw_driver_kernel_layout_v1",
    "cudaw_driver_trace_mode_v1",
    "cudaw_driver_thread_launches_v1",
    "cudaw_driver_total_launches_v1",
];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let mut all = read_list(&manifest.join("data/cuda-13.driver-functions"));
    all.sort();
    all.dedup();
    // The one list of wrapped functions and their groups (`data/wrapped.txt`); the
    // launches' wrappers mark them in flight themselves, so their trampolines are plain.
    let wrapped = read_wrapped(&manifest.join("data/wrapped.txt"), &GROUPS, &all);
    fs::write(out.join("wrapped.rs"), wrapped_rs(&wrapped, &GROUPS)).unwrap();
    let marked_by_wrapper = in_group(&wrapped, "launch");
    fs::write(
        out.join("names.rs"),
        names_rs(&all, all.len(), "function the driver exports", ""),
    )
    .unwrap();
    fs::write(
        out.join("trampolines.s"),
        trampolines(
            &all,
            &all,
            GateWord::PointerMask(PAUSED),
            Some("cudaw_driver_trampolines"),
            Some(InFlight {
                prefix: "cudaw_drv",
                marked: &|name| marked_by_trampoline(name, &marked_by_wrapper),
            }),
            None,
        ),
    )
    .unwrap();
    fs::write(out.join("slow.s"), slow_path()).unwrap();
    fs::write(out.join("inflight.s"), in_flight_support("cudaw_drv")).unwrap();
    let mut global = all.clone();
    global.extend(OWN_EXPORTS.iter().map(|s| (*s).to_owned()));
    link_cdylib(&out, &version_script(None, &global), "libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}

/// The groups of `data/wrapped.txt` (described there).
const GROUPS: [&str; 3] = ["always", "launch", "copies"];

/// The gate bit the driver's trampolines test: the runtime shim's "paused" bit (its
/// "uninitialised" bit is the runtime's own business); `driver::hooks::GATE_PAUSED`,
/// checked against this in `dispatch.rs`.
const PAUSED: u32 = 2;
