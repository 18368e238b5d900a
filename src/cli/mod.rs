//! The command line: parses arguments, loads the config, and calls into the library.
//!
//! Exit status: 0 success, 1 a runtime failure (daemon unreachable, port taken), 2 bad usage or config.

mod advise;
mod arg_error;
mod args;
mod attach;
mod check;
mod jobs;
mod launch;
mod rewrite;
mod slurm;
mod status;
mod top;

use std::process::ExitCode;

use clap::Parser;

use crate::config::{self, Config, LogFormat, LogLevel};
use crate::control::Request;
use args::{Cli, Command, ConfigCommand, SocketArg};

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
        runtime_dir,
        process_root,
        successor_grace_ms,
    } = &cli.command
    {
        crate::logging::init(
            cli.log_level.unwrap_or(LogLevel::Info),
            cli.log_format.unwrap_or(LogFormat::Text),
        );
        return crate::guardian::run(
            runtime_dir,
            process_root,
            std::time::Duration::from_millis((*successor_grace_ms).min(60_000)),
        );
    }
    if let Command::Launch(a) = &cli.command {
        // Warnings and errors on stderr, beside the job's own (`--log-level`, `RUST_LOG` for more).
        crate::logging::init(
            cli.log_level.unwrap_or(LogLevel::Warn),
            cli.log_format.unwrap_or(LogFormat::Text),
        );
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
                // Longer than a calm sampling interval, so that a calm daemon's full samples find
                // their blocking thread parked rather than start a new one each time.
                .thread_keep_alive(std::time::Duration::from_secs(120))
                .build()?;
            // The owner task runs on a worker, not on this thread: a timer then wakes the worker
            // that already holds the time driver, with no hand-off to a thread parked in
            // `block_on` (half the idle wake-ups).
            runtime
                .block_on(runtime.spawn(crate::daemon::run(config)))
                .map_err(|e| anyhow::anyhow!("the daemon's task failed: {e}"))??;
            Ok(())
        }
        Command::Status { json, url, watch } => status::run(&cli, *json, url.clone(), *watch),
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
        } => attach::run(
            &cli,
            socket,
            attach::Attach {
                pid: *pid,
                name: name.clone(),
                config_file: config_file.as_deref(),
                profile: profile.clone(),
                keys: keys.clone(),
                token_file: token_file.as_deref(),
            },
        ),
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
        Command::Check(a) => check::run(&cli, a),
        Command::Rewrite { file, set } => rewrite::run(file, set),
        Command::Top {
            url,
            interval,
            socket,
        } => top::start(&cli, url.clone(), *interval, socket),
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
                print!("{}", config::example_toml()?);
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
