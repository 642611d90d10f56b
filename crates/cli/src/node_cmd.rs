//! `cudaw node`: the node daemon (crates/node does the work), and `cudaw node status`.

use anyhow::Result;
use clap::{Args as ClapArgs, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

use crate::failure::{fail, Kind};

/// What `cudaw node --help` says first.
pub const LONG_ABOUT: &str = r#"Runs the node daemon: it shares each GPU between the jobs of the processes under cudaw on this machine.

Every process started with `cudaw run` serves a control socket in its run folder; the daemon
finds them there (every 20 ms by default), asks each for its status, and joins it to the
GPUs it has memory on, under its job id: `cudaw run --job ID`, or, for a process started
without one, the job `pid-PID` with the shares of the configuration's [default] table. The
policy (crates/sched) then hands each GPU's time to the jobs in quanta by their shares: a
job out of its turn waits at its gate before its next CUDA call; when the jobs' memory does
not fit the GPU, the memory of jobs not running is swapped out to host memory and back in
before their turn.

The daemon runs in the foreground and logs to standard error: jobs joining and leaving,
configuration reloads, swaps and failures (CUDAW_LOG=debug adds every hold and release).
The configuration file is read at the start (a bad one: exit status 2), then watched every
second: a change applies at once; a bad edit is refused with its line and reason, and the
configuration loaded before stays in force.

When the daemon stops (SIGTERM, SIGINT), it releases every process it holds and swaps in
every one it swapped out, so nothing stays gated. When it dies, each held process opens its
own gate within a few seconds (its hold's lease) and runs on ungated; a process it had
swapped out stays paused until a daemon is back (or `cudaw-ckpt resume PID`). A process
started while no daemon runs behaves as without one, and joins once one starts."#;

const AFTER_HELP: &str = "Examples:\n  cudaw node --config /etc/cudaw/node.toml\n  cudaw node --config node.toml --metrics 127.0.0.1:9400\n  cudaw node --config node.toml --run-dir /tmp/my-run-folder --socket /tmp/node.sock\n  cudaw run --job train-a -- python3 train.py    # a process of the job train-a\n  cudaw node status\n  cudaw node status --json\n\nA configuration (see the docs' \"Sharing a GPU\" page):\n  quantum = \"50ms\"\n  [default]\n  request = 0.0\n  limit = 1.0\n  [[job]]\n  id = \"train-a\"\n  request = 0.25\n  limit = 0.5\n  memory = \"8G\"\n  priority = 10\n\nThe run folders looked in, unless --run-dir names others: those `cudaw-ckpt status`\nlooks in (CUDAW_RUN_DIR alone when set, else $XDG_RUNTIME_DIR/cudaw and /tmp/cudaw-UID),\nand as root every user's (/run/user/*/cudaw, /tmp/cudaw-*). The status socket, unless\n--socket names another: $CUDAW_NODE_SOCKET, else /run/cudaw/node.sock as root, else\n$XDG_RUNTIME_DIR/cudaw/node.sock or /tmp/cudaw-UID/node.sock.\n\nExit status: 0 after a stop by signal, 2 for a usage error or a configuration refused at\nthe start, 1 when the daemon cannot start otherwise (another daemon serves the socket, the\nmetrics address is taken).";

/// The node daemon, or its status.
#[derive(Debug, ClapArgs)]
#[command(args_conflicts_with_subcommands = true, long_about = LONG_ABOUT, after_help = AFTER_HELP)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Sub>,
    /// The configuration (TOML: `[[job]]` tables with id, request, limit, memory, priority,
    /// gpus), watched for changes.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A run folder to look in for processes under cudaw, instead of the defaults (may be
    /// given several times).
    #[arg(long = "run-dir", value_name = "DIR")]
    pub run_dir: Vec<PathBuf>,
    /// The status socket `cudaw node status` reads.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Serve Prometheus metrics on GET /metrics at this address (127.0.0.1:9400).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// How often the run folders are scanned and each process asked for its status.
    #[arg(long, value_name = "TIME", default_value = "20ms", value_parser = cudaw_node::parse_interval)]
    pub interval: Duration,
}

/// `cudaw node`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Sub {
    /// Show the daemon's jobs on each GPU: shares configured and achieved over the last
    /// minute, memory resident and swapped out, swaps, waits.
    #[command(
        after_help = "Examples:\n  cudaw node status\n  cudaw node status --json | jq '.gpus[].jobs[] | {id, achieved_share}'\n\nThe JSON: {\"gpus\":[{\"index\",\"uuid\",\"capacity\",\"jobs\":[{\"id\",\"pids\",\"request\",\"limit\",\"memory\",\"priority\",\"achieved_share\",\"resident_bytes\",\"swapped_bytes\",\"swaps\",\"waits\",\"running\"}]}],\"config\":{\"path\",\"loaded\",\"error\"},\"processes\":[{\"pid\",\"job\",\"gpus\",\"note\"}],\"pid\",\"run_dirs\"}."
    )]
    Status(StatusArgs),
}

/// `cudaw node status`'s arguments.
#[derive(Debug, ClapArgs)]
pub struct StatusArgs {
    /// Print the daemon's report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// The daemon's status socket (default: as `cudaw node`'s).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

impl Args {
    /// Whether failures are reported as JSON.
    pub fn json(&self) -> bool {
        matches!(&self.command, Some(Sub::Status(s)) if s.json)
    }
}

/// Runs `cudaw node` or `cudaw node status`.
pub fn run(args: &Args) -> Result<()> {
    if let Some(Sub::Status(s)) = &args.command {
        return status(s);
    }
    let Some(config) = &args.config else {
        return Err(fail(
            Kind::Usage,
            "cudaw node needs --config FILE (the jobs' shares; see `cudaw node --help`), or the subcommand `status`",
        ));
    };
    let opts = cudaw_node::Options {
        config: config.clone(),
        run_dirs: args.run_dir.clone(),
        socket: args.socket.clone(),
        metrics: args.metrics.clone(),
        interval: args.interval,
        timing: cudaw_node::exec::Timing::default(),
    };
    let start = |e: cudaw_node::StartError| match e {
        cudaw_node::StartError::Config(m) => fail(Kind::Usage, m),
        cudaw_node::StartError::Other(m) => fail(Kind::Failed, m),
    };
    let stop = cudaw_node::stop_on_signals().map_err(start)?;
    cudaw_node::run(&opts, &stop).map_err(start)
}

fn status(s: &StatusArgs) -> Result<()> {
    let path = s.socket.clone().unwrap_or_else(cudaw_node::default_socket);
    let report = cudaw_node::server::query(&path).map_err(|e| fail(Kind::Connection, e))?;
    if s.json {
        return outln!("{}", serde_json::to_string(&report)?);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    out!("{}", cudaw_node::report::table(&report, now))
}
