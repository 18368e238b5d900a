//! The command line's grammar: every command, its arguments and their help (clap derives the
//! parser, the completions and the man page from these types).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{LogFormat, LogLevel};

#[derive(Parser)]
#[command(name = "memwatch", version, about = "Keeps training jobs alive on tight machines", long_about = None)]
pub(super) struct Cli {
    /// Config file [default: /etc/memwatch/memwatch.toml; a missing default file means defaults]
    #[arg(long, global = true, value_name = "PATH")]
    pub(super) config: Option<PathBuf>,
    /// Log level (RUST_LOG, when set, takes precedence)
    #[arg(long, global = true, value_enum)]
    pub(super) log_level: Option<LogLevel>,
    /// Log format
    #[arg(long, global = true, value_enum)]
    pub(super) log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Subcommand)]
pub(super) enum Command {
    /// Run the daemon in the foreground (systemd runs it this way)
    Run {
        /// Listen address, overriding the config's `listen`
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
    },
    /// The daemon's guardian (started by `memwatch run`; resumes paused jobs if the daemon dies)
    #[command(hide = true)]
    Guardian {
        #[arg(long, value_name = "DIR")]
        runtime_dir: PathBuf,
        #[arg(long, value_name = "DIR", default_value = "/")]
        process_root: PathBuf,
        /// How long to wait for a successor daemon before resuming the jobs
        #[arg(long, value_name = "MS", default_value_t = 0)]
        successor_grace_ms: u64,
    },
    /// Show levels, jobs, memory, swap, pressure and GPUs as the running daemon sees them
    Status {
        /// Print the daemon's snapshot as JSON instead of a table
        #[arg(long)]
        json: bool,
        /// Refresh every SECONDS until interrupted
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2", conflicts_with = "json")]
        watch: Option<f64>,
        /// The daemon's base URL [default: from the config's `listen`]
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
    /// A live terminal view: levels, RAM, swap, pressure and GPUs with sparklines, GPU processes, jobs;
    /// p, r and d pause, resume and detach the selected job
    Top {
        /// The daemon's base URL [default: from the config's `listen`]
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Seconds between refreshes
        #[arg(long, value_name = "SECONDS", default_value = "1")]
        interval: f64,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Follow a training job: the process and all its descendants, and protect it
    Attach {
        #[arg(required_unless_present = "slurm_job")]
        pid: Option<u32>,
        /// A Slurm job by id instead: every task of it on this node (root may attach it before its
        /// first task starts here, as the prolog in deploy/slurm/ does)
        #[arg(long, value_name = "ID", conflicts_with_all = ["pid", "config_file"])]
        slurm_job: Option<String>,
        /// A name for the job [default: <command>-<pid>, or slurm-<ID>]
        #[arg(long)]
        name: Option<String>,
        /// The job's training config (JSON, YAML or TOML), rewritten at epoch boundaries
        #[arg(long, value_name = "FILE")]
        config_file: Option<PathBuf>,
        /// Where the knobs live in it: deepspeed, hf, accelerate or generic
        #[arg(long, requires = "config_file")]
        profile: Option<String>,
        /// KNOB=dotted.path (batch, accumulation, workers, pin_memory, seq_len, world_size); repeatable
        #[arg(long = "key", value_name = "KNOB=PATH", requires = "config_file")]
        keys: Vec<String>,
        /// Also write the job's token to FILE (mode 0600, yours), for a trainer someone else attached:
        /// it reads the token from there (docs/protocol.md)
        #[arg(long, value_name = "FILE", requires = "config_file")]
        token_file: Option<PathBuf>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Start a job under memwatch: in a cgroup of its own, attached from its first instruction, and
    /// relaunched (with `{resume}` = 1) when it was stopped
    Launch(super::launch::LaunchArgs),
    /// What a seasoned engineer would change now, for the machine or one job
    Advise {
        /// Job name (all advice when left out)
        target: Option<String>,
        #[arg(long)]
        json: bool,
        /// The daemon's base URL [default: from the config's `listen`]
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
    /// Stop following a job (a paused job is resumed first)
    Detach {
        /// Job name or pid
        #[arg(required_unless_present = "slurm_job")]
        target: Option<String>,
        /// The job that belongs to this Slurm job (the epilog in deploy/slurm/)
        #[arg(long, value_name = "ID", conflicts_with = "target")]
        slurm_job: Option<String>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Pause a job's whole process tree now (memwatch will not resume it by itself)
    Pause {
        target: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Resume a paused job
    Resume {
        target: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// List attached jobs
    Jobs {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Estimate what a model needs per ZeRO layout on this machine, and recommend a setup
    Check(super::check::CheckArgs),
    /// Change values in a JSON, YAML or TOML file safely (what memwatch does to training configs)
    Rewrite {
        file: PathBuf,
        /// dotted.path=value (true/false, a number, or a string); repeatable
        #[arg(long = "set", value_name = "PATH=VALUE", required = true)]
        set: Vec<String>,
    },
    /// Configuration helpers
    Config {
        #[command(subcommand)]
        what: ConfigCommand,
    },
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout
    Manpage,
}

#[derive(clap::Args)]
pub(super) struct SocketArg {
    /// The daemon's control socket [default: the config's `control.socket`]
    #[arg(long, value_name = "PATH")]
    pub(super) socket: Option<PathBuf>,
}

#[derive(Subcommand)]
pub(super) enum ConfigCommand {
    /// Print the documented example configuration (all defaults)
    Example,
    /// Check a config file and print the settings in force
    Check,
}
