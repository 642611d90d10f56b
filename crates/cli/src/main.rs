//! `cudaw`: the command-line tool. One module per subcommand; `main` only dispatches.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[macro_use]
mod out;
// Shared with cudaw-ckpt: the control socket's client side and its progress bars.
#[allow(dead_code)]
mod ckpt_client;
#[allow(dead_code)]
mod ckpt_progress;
mod demo_cmd;
mod device;
#[allow(dead_code)]
mod failure;
mod fatbin_cmd;
mod node_cmd;
mod run_cmd;

/// What `cudaw --help` says after the commands.
const AFTER_HELP: &str = "Exit status: 0 on success, 1 on a failure, 2 for a usage error \
(`cudaw run` exits with the program's own status). With --json (demo, fatbin), a failure \
prints one line on standard output, {\"ok\":false,\"kind\":KIND,\"error\":MESSAGE}, as \
cudaw-ckpt does, besides the message on standard error. A closed standard output \
(`| head -1`) ends a command quietly with status 0.";

/// cudaw: run CUDA programs under the cudaw runtime and inspect their device code.
#[derive(Debug, Parser)]
#[command(name = "cudaw", version, about, long_about = None, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show what cudaw does: run an example CUDA program natively and under cudaw,
    /// pausing, resuming, dumping and restoring it on the way (on the GPU if there is one,
    /// else on simgpu). Start here.
    #[command(long_about = demo_cmd::LONG_ABOUT)]
    Demo(demo_cmd::Args),
    /// List the kernels in a CUDA binary with their parameter layouts.
    Fatbin(fatbin_cmd::Args),
    /// Run a CUDA program under cudaw's drop-in runtime.
    Run(run_cmd::Args),
    /// Run the node daemon that shares each GPU between the jobs under cudaw
    /// (`cudaw node --config FILE`), or show its status (`cudaw node status`).
    Node(node_cmd::Args),
}

fn main() -> ExitCode {
    let cli = match failure::parse::<Cli>() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (result, json) = match cli.command {
        Command::Demo(args) => (demo_cmd::run(&args), args.json),
        Command::Fatbin(args) => (fatbin_cmd::run(&args), args.json),
        Command::Run(args) => (run_cmd::run(&args), false),
        Command::Node(args) => (node_cmd::run(&args), args.json()),
    };
    failure::finish("cudaw", result, json)
}
