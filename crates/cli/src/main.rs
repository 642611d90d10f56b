//! `cudaw`: the command-line tool. One module per subcommand; `main` only dispatches.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// List the kernels in a CUDA binary with their parameter layouts.
    Fatbin(fatbin_cmd::Args),
    /// Run a CUDA program under cudaw's drop-in runtime.
    Run(run_cmd::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
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
