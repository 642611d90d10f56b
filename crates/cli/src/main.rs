//! `cudaw`: the command-line tool. One module per subcommand; `main` only dispatches.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

// Shared with cudaw-ckpt: the control socket's client side and its progress bars.
#[allow(dead_code)]
mod ckpt_client;
#[allow(dead_code)]
mod ckpt_progress;
mod demo_cmd;
mod fatbin_cmd;
mod run_cmd;

/// cudaw: run CUDA programs under the cudaw runtime and inspect their device code.
#[derive(Debug, Parser)]
#[command(name = "cudaw", version, about, long_about = None)]
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo_cmd::run(&args),
        Command::Fatbin(args) => fatbin_cmd::run(&args),
        Command::Run(args) => run_cmd::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudaw: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
