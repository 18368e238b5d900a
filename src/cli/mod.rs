//! The command line: parses arguments, loads the config, and calls into the library.
//!
//! Exit status: 0 success, 1 a runtime failure (daemon unreachable, port taken), 2 bad usage or config.

mod advise;
mod check;
mod jobs;
mod launch;
mod slurm;
mod status;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{self, Config, LogFormat, LogLevel};
use crate::control::Request;

#[derive(Parser)]
#[command(name = "memwatch", version, about = "Keeps training jobs alive on tight machines", long_about = None)]
struct Cli {
    /// Config file [default: /etc/memwatch/memwatch.toml; a missing default file means defaults]
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Log level (RUST_LOG, when set, takes precedence)
    #[arg(long, global = true, value_enum)]
    log_level: Option<LogLevel>,
    /// Log format
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
        state_dir: PathBuf,
        #[arg(long, value_name = "DIR", default_value = "/")]
        process_root: PathBuf,
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
    Launch(launch::LaunchArgs),
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
    Check(check::CheckArgs),
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
struct SocketArg {
    /// The daemon's control socket [default: the config's `control.socket`]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the documented example configuration (all defaults)
    Example,
    /// Check a config file and print the settings in force
    Check,
}

/// An error with the exit status it deserves.
struct Failure {
    code: u8,
    error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            code: 1,
            error: e.into(),
        }
    }
}

fn usage(error: impl Into<anyhow::Error>) -> Failure {
    Failure {
        code: 2,
        error: error.into(),
    }
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run { .. }) {
        // A client whose reader went away (`memwatch jobs --json | head`) ends quietly, as `cat`
        // does, instead of panicking in println!. The daemon keeps Rust's default (EPIPE errors).
        // SAFETY: SIG_DFL installs no handler code.
        let _ = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGPIPE,
                nix::sys::signal::SigHandler::SigDfl,
            )
        };
    }
    if let Command::Guardian {
        state_dir,
        process_root,
    } = &cli.command
    {
        crate::logging::init(
            cli.log_level.unwrap_or(LogLevel::Info),
            cli.log_format.unwrap_or(LogFormat::Text),
        );
        return crate::guardian::run(state_dir, process_root);
    }
    if let Command::Launch(a) = &cli.command {
        return match launch::run(&cli, a) {
            Ok(code) => ExitCode::from(code),
            Err(f) => {
                eprintln!("memwatch: {:#}", f.error);
                ExitCode::from(f.code)
            }
        };
    }
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("memwatch: {:#}", f.error);
            ExitCode::from(f.code)
        }
    }
}

fn load_config(cli: &Cli) -> Result<Config, Failure> {
    config::load(cli.config.as_deref()).map_err(usage)
}

/// The URL of the daemon a client command talks to.
fn daemon_url(config: &Config) -> String {
    let mut addr = config.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    format!("http://{addr}")
}

fn dispatch(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        // Handled in `main`, which passes on the job's exit code.
        Command::Launch(_) => Ok(()),
        Command::Guardian { .. } => Ok(()),
        Command::Run { listen } => {
            let mut config = load_config(&cli)?;
            if let Some(l) = listen {
                config.listen = *l;
            }
            crate::logging::init(
                cli.log_level.unwrap_or(config.log.level),
                cli.log_format.unwrap_or(config.log.format),
            );
            // Two workers: HTTP and the control socket answer while the owner task works.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .max_blocking_threads(4)
                .build()?;
            runtime.block_on(crate::daemon::run(config))?;
            Ok(())
        }
        Command::Status { json, url, watch } => {
            let config = load_config(&cli)?;
            let url = url.clone().unwrap_or_else(|| daemon_url(&config));
            let client = crate::client::Client::new(&url);
            if *json {
                println!("{}", serde_json::to_string_pretty(&client.snapshot()?)?);
                return Ok(());
            }
            let paint = crate::human::Paint::for_stdout();
            let screen = || -> anyhow::Result<String> {
                let sample: crate::sample::Sample = client.sample()?;
                let view: status::Overview = client.get("/api/v1/jobs")?;
                Ok(status::render(
                    &sample,
                    &view,
                    &url,
                    crate::clock::wall_ms(),
                    paint,
                ))
            };
            match watch {
                None => print!("{}", screen()?),
                Some(secs) if !(0.1..=3600.0).contains(secs) => {
                    return Err(usage(anyhow::anyhow!(
                        "--watch takes 0.1 to 3600 seconds, got {secs}"
                    )));
                }
                Some(secs) => loop {
                    // Home and clear, then the screen; a daemon that went away is said in place.
                    let text = screen().unwrap_or_else(|e| format!("{e:#}\n"));
                    print!("\x1b[H\x1b[2J{text}");
                    std::io::Write::flush(&mut std::io::stdout())?;
                    std::thread::sleep(std::time::Duration::from_secs_f64(*secs));
                },
            }
            Ok(())
        }
        Command::Attach {
            slurm_job: Some(id),
            name,
            socket,
            ..
        } => slurm::attach(&cli, socket, id, name.clone()),
        Command::Detach {
            slurm_job: Some(id),
            socket,
            ..
        } => slurm::detach(&cli, socket, id),
        Command::Attach {
            pid: Some(pid),
            name,
            config_file,
            profile,
            keys,
            token_file,
            socket,
            slurm_job: None,
        } => {
            // The token file is opened before the attach, so a path that cannot be written fails
            // before anything changes.
            let mut token_out = match token_file {
                Some(path) => Some((path, open_private(path)?)),
                None => None,
            };
            // Absolute, but not resolved: the daemon refuses symlinks itself.
            let config_file = match config_file {
                Some(f) => Some(
                    std::path::absolute(f)
                        .map_err(|e| usage(anyhow::anyhow!("{}: {e}", f.display())))?,
                ),
                None => None,
            };
            let attached = control_call(
                &cli,
                socket,
                Request::Attach {
                    pid: *pid,
                    name: name.clone(),
                    config_file,
                    profile: profile.clone(),
                    keys: keys.clone(),
                    launch: None,
                },
            );
            let r = match attached {
                Ok(r) if r.ok => r,
                other => {
                    if let Some((path, _)) = token_out.take() {
                        let _ = std::fs::remove_file(path);
                    }
                    other?
                }
            };
            let token = r.token.clone();
            if let (Some((path, file)), Some(t)) = (token_out.as_mut(), token.as_ref()) {
                use std::io::Write;
                writeln!(file, "{t}")
                    .and_then(|()| file.sync_all())
                    .map_err(|e| {
                        anyhow::anyhow!("{}: cannot write the token: {e}", path.display())
                    })?;
            }
            print_job("attached", r)?;
            if let Some(t) = token {
                println!("token: {t}");
                println!(
                    "  (the trainer sends it as `Authorization: Bearer <token>`; keep it private)"
                );
            }
            Ok(())
        }
        Command::Advise { target, json, url } => {
            let config = load_config(&cli)?;
            let url = url.clone().unwrap_or_else(|| daemon_url(&config));
            let path = match target {
                Some(t) => format!("/api/v1/advice?job={t}"),
                None => "/api/v1/advice".to_owned(),
            };
            let v: serde_json::Value = crate::client::Client::new(&url).get(&path)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let items: Vec<crate::advice::Advice> =
                    serde_json::from_value(v["advice"].clone())?;
                print!("{}", advise::render(&items));
            }
            Ok(())
        }
        // clap requires one of the two.
        Command::Attach { pid: None, .. } | Command::Detach { target: None, .. } => Err(usage(
            anyhow::anyhow!("name the job: a pid (attach), a job (detach), or --slurm-job ID"),
        )),
        Command::Detach {
            target: Some(target),
            socket,
            slurm_job: None,
        } => {
            control_call(
                &cli,
                socket,
                Request::Detach {
                    target: target.clone(),
                },
            )?;
            println!("detached {target}");
            Ok(())
        }
        Command::Pause { target, socket } => {
            let r = control_call(
                &cli,
                socket,
                Request::Pause {
                    target: target.clone(),
                },
            )?;
            print_job("paused", r)
        }
        Command::Resume { target, socket } => {
            let r = control_call(
                &cli,
                socket,
                Request::Resume {
                    target: target.clone(),
                },
            )?;
            print_job("resumed", r)
        }
        Command::Jobs { json, socket } => {
            let r = control_call(&cli, socket, Request::Jobs {})?;
            let jobs = r.jobs.unwrap_or_default();
            if *json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else {
                print!("{}", jobs::render(&jobs, crate::clock::wall_ms()));
                print!(
                    "{}",
                    jobs::render_ended(&r.ended.unwrap_or_default(), crate::clock::wall_ms())
                );
            }
            Ok(())
        }
        Command::Check(a) => {
            let config = load_config(&cli)?;
            let machine = check::machine(&config, a)?;
            let model = check::model(a, machine.gpus.len()).map_err(usage)?;
            let report = crate::check::check(machine, model);
            let fits = report.recommendation.fits != Some(false);
            if a.json {
                let (per_node, nodes) = check::world(&report);
                let rec = &report.recommendation;
                let v = serde_json::json!({
                    "report": report,
                    "deepspeed": fits.then(|| crate::check::deepspeed_json(rec, per_node * nodes)),
                    "accelerate": fits.then(|| crate::check::accelerate_yaml(rec, per_node, nodes)),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", check::render(&report));
            }
            if fits {
                Ok(())
            } else {
                Err(Failure {
                    code: 3,
                    error: anyhow::anyhow!("the model does not fit in any layout (see the notes)"),
                })
            }
        }
        Command::Rewrite { file, set } => {
            let format = crate::rewrite::Format::of(file).ok_or_else(|| {
                usage(anyhow::anyhow!(
                    "{}: unknown format; use .json, .yaml, .yml or .toml",
                    file.display()
                ))
            })?;
            let mut edits = Vec::new();
            for s in set {
                let (k, v) = s
                    .split_once('=')
                    .ok_or_else(|| usage(anyhow::anyhow!("--set {s:?}: expected PATH=VALUE")))?;
                edits.push((k.to_owned(), crate::rewrite::Scalar::parse(v)));
            }
            let file = &std::path::absolute(file)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            // Root rewrites a file with its owner's rights; anyone else with their own.
            let me = nix::unistd::geteuid();
            let owner = if me.is_root() {
                crate::rewrite::write::Owner::FileOwner
            } else {
                crate::rewrite::write::Owner::Uid(me.as_raw())
            };
            let out = crate::rewrite::write::rewrite(file, format, owner, &edits)?;
            for (path, old) in out.before {
                let new = edits
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, v)| v.to_string())
                    .unwrap_or_default();
                let old = old.map(|o| o.to_string()).unwrap_or_default();
                println!("{path}: {old} → {new}");
            }
            Ok(())
        }
        Command::Top {
            url,
            interval,
            socket,
        } => {
            if !(0.1..=60.0).contains(interval) {
                return Err(usage(anyhow::anyhow!(
                    "--interval takes 0.1 to 60 seconds, got {interval}"
                )));
            }
            use std::io::IsTerminal;
            if !std::io::stdout().is_terminal() {
                return Err(usage(anyhow::anyhow!(
                    "memwatch top needs a terminal; use `memwatch status --watch` or `--json` otherwise"
                )));
            }
            let config = load_config(&cli)?;
            top::run(&top::Args {
                url: url.clone().unwrap_or_else(|| daemon_url(&config)),
                socket: socket.socket.clone().unwrap_or(config.control.socket),
                interval: std::time::Duration::from_secs_f64(*interval),
            })?;
            Ok(())
        }
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "memwatch", &mut std::io::stdout());
            Ok(())
        }
        Command::Manpage => {
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?;
            Ok(())
        }
        Command::Config { what } => match what {
            ConfigCommand::Example => {
                print!("{}", config::example_toml().map_err(anyhow::Error::msg)?);
                Ok(())
            }
            ConfigCommand::Check => {
                let config = load_config(&cli)?;
                print!("{}", toml::to_string(&config)?);
                Ok(())
            }
        },
    }
}

fn control_call(
    cli: &Cli,
    socket: &SocketArg,
    request: Request,
) -> Result<crate::control::Response, Failure> {
    let path = match &socket.socket {
        Some(p) => p.clone(),
        None => load_config(cli)?.control.socket,
    };
    Ok(crate::control::client::call(&path, &request)?)
}

fn print_job(verb: &str, r: crate::control::Response) -> Result<(), Failure> {
    match r.job {
        Some(j) if r.dry_run => println!(
            "dry run: {} (pid {}) was not {verb}; the daemon runs with policy.dry_run = true and only records what it would do",
            j.name, j.pid
        ),
        Some(j) => println!("{verb} {} (pid {})", j.name, j.pid),
        None => println!("{verb}"),
    }
    Ok(())
}

/// Creates `path` for a secret: new or truncated, mode 0600, never through a symbolic link.
fn open_private(path: &std::path::Path) -> Result<std::fs::File, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            usage(anyhow::anyhow!(
                "{}: cannot create the token file: {e}",
                path.display()
            ))
        })
}
