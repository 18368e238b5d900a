//! `memwatch launch`: starts a job under memwatch, in a memory cgroup of its own (cgroup v2, or v1
//! memory and freezer), attached before its first instruction, and relaunches it when it was stopped
//! (by memwatch's `terminate`, a signal, or its cgroup's OOM killer) — with `{resume}` in its arguments
//! and `MEMWATCH_RESUME` in its environment set to 1, so that it resumes from its checkpoint and reads
//! its config (which memwatch may have rewritten) afresh. It runs as the invoking user.
//!
//! The job's environment names it (`MEMWATCH_JOB`), says where the daemon is (`MEMWATCH_SOCKET`,
//! `MEMWATCH_URL`) and where its token is (`MEMWATCH_TOKEN_FILE`, with a config file), and carries
//! launch's own marker, `MEMWATCH_LAUNCHED`: the pid of this `memwatch launch`, an ancestor of every
//! process of the job. A client takes the job as already attached only when that pid is its ancestor:
//! `MEMWATCH_JOB` alone, which users set by hand to name a job, never means so.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

mod cgroup;
mod container;
mod error;
mod manager;
mod private;
mod scope;

use cgroup::JobCgroup;
use error::LaunchError;

use super::{Failure, SocketArg, usage};
use crate::control::Request;

#[derive(clap::Args)]
pub struct LaunchArgs {
    /// A name for the job [default: the program's name]
    #[arg(long)]
    pub name: Option<String>,
    /// The job's training config (JSON, YAML or TOML), which memwatch may rewrite between runs
    #[arg(long, value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Where the knobs live in it: deepspeed, hf, accelerate or generic
    #[arg(long, requires = "config_file")]
    pub profile: Option<String>,
    /// KNOB=dotted.path; repeatable
    #[arg(long = "key", value_name = "KNOB=PATH", requires = "config_file")]
    pub keys: Vec<String>,
    /// Relaunch at most this many times after the job was stopped
    #[arg(long, default_value_t = 3)]
    pub max_restarts: u32,
    /// The cgroup's memory limit: bytes, or with K, M or G (binary) [default: none of its own]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory_max: Option<u64>,
    /// Let memwatch's way out raise this job's cgroup limit for a while (and lower it back) when a
    /// pause finds no room
    #[arg(long)]
    pub lend: bool,
    #[command(flatten)]
    pub socket: SocketArg,
    /// The command and its arguments; `{resume}` in them becomes 0 on the first run, 1 on relaunches
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn parse_size(s: &str) -> Result<u64, super::arg_error::ArgError> {
    let (digits, shift) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t.trim_end_matches('K').to_owned(), 10),
        t if t.ends_with('M') => (t.trim_end_matches('M').to_owned(), 20),
        t if t.ends_with('G') => (t.trim_end_matches('G').to_owned(), 30),
        t => (t, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .filter(|n| *n >= 1 << 20)
        .ok_or_else(|| super::arg_error::ArgError::Size(s.to_owned()))
}

/// How one run ended.
enum Ended {
    Finished,
    Failed(i32),
    Stopped(String),
}

fn describe(status: std::process::ExitStatus, oom_kills: u64) -> Ended {
    if oom_kills > 0 {
        return Ended::Stopped(format!("its cgroup's OOM killer fired {oom_kills} time(s)"));
    }
    match (status.code(), status.signal()) {
        (Some(0), _) => Ended::Finished,
        (Some(c), _) => Ended::Failed(c),
        (None, Some(s)) => Ended::Stopped(format!(
            "ended by signal {}",
            nix::sys::signal::Signal::try_from(s).map_or_else(|_| s.to_string(), |s| s.to_string())
        )),
        (None, None) => Ended::Failed(1),
    }
}

/// Runs `memwatch launch`; the exit code is the job's when it finished or failed on its own.
pub fn run(cli: &super::Cli, a: &LaunchArgs) -> Result<u8, Failure> {
    let program = a
        .command
        .first()
        .ok_or_else(|| usage(anyhow::anyhow!("no command")))?;
    let container = container::ContainerRun::parse(&a.command);
    if let (Some(c), Some(_)) = (&container, a.memory_max) {
        return Err(usage(anyhow::anyhow!(
            "the container's engine sets its limit: give `{} run` --memory instead of launch's \
             --memory-max",
            c.engine()
        )));
    }
    let name = a.name.clone().unwrap_or_else(|| {
        Path::new(program)
            .file_name()
            .map_or_else(|| "job".into(), |n| n.to_string_lossy().into_owned())
    });
    let config_file = match &a.config_file {
        Some(f) => Some(
            std::path::absolute(f).map_err(|e| usage(anyhow::anyhow!("{}: {e}", f.display())))?,
        ),
        None => None,
    };
    // Where the job's own client (the Python package) finds the daemon.
    let (config, socket) = match (super::load_config(cli), &a.socket.socket) {
        (Ok(c), s) => {
            let socket = s.clone().unwrap_or_else(|| c.control.socket.clone());
            (Some(c), socket)
        }
        (Err(_), Some(s)) => (None, s.clone()),
        (Err(e), None) => return Err(e),
    };
    let mut env = vec![(
        "MEMWATCH_SOCKET".to_owned(),
        socket.to_string_lossy().into_owned(),
    )];
    if let Some(c) = &config {
        env.push(("MEMWATCH_URL".to_owned(), super::daemon_url(c)));
    }
    let daemon = Daemon { socket, env };
    if let Some(c) = container {
        let runtime = private_dir()?;
        let result = container::runs(&c, a, config_file, &runtime, &daemon);
        let _ = std::fs::remove_dir_all(&runtime);
        return result;
    }
    // Inside a Slurm allocation, Slurm's cgroup; where systemd runs the machine, a scope of its own
    // per run; else a cgroup of its own.
    let place = match slurm_allocation() {
        Some(id) => {
            Place::Cgroup(JobCgroup::in_slurm_job(&id, a.memory_max.is_some()).map_err(usage)?)
        }
        None if scope::systemd_runs_here() => Place::Scope,
        None => Place::Cgroup(JobCgroup::create(&name, a.memory_max).map_err(anyhow::Error::from)?),
    };
    let runtime = private_dir()?;
    let token_file = runtime.join("token");
    let result = runs(a, &name, config_file, &place, &token_file, &daemon);
    let _ = std::fs::remove_dir_all(&runtime);
    result
}

/// A private directory of a new name (mkdtemp: mode 0700, never an existing one): a launch killed
/// before it could remove its own leaves it behind, and its pid comes round again.
fn private_dir() -> Result<PathBuf, Failure> {
    let template = std::env::temp_dir().join("memwatch-launch-XXXXXX");
    nix::unistd::mkdtemp(&template).map_err(|e| {
        anyhow::anyhow!(
            "cannot make a private directory like {}: {e}",
            template.display()
        )
        .into()
    })
}

/// Where the job runs: one cgroup for every run, or a systemd scope made for each.
enum Place {
    Cgroup(JobCgroup),
    Scope,
}

/// The daemon, as resolved once at the start: its control socket, and what the job's environment says
/// of it.
struct Daemon {
    socket: PathBuf,
    env: Vec<(String, String)>,
}

fn runs(
    a: &LaunchArgs,
    name: &str,
    config_file: Option<PathBuf>,
    place: &Place,
    token_file: &Path,
    daemon: &Daemon,
) -> Result<u8, Failure> {
    let mut account: Vec<String> = Vec::new();
    // Requeued by Slurm (memwatch's way out, or a node failure): the first run here resumes too.
    let requeued = std::env::var("SLURM_RESTART_COUNT")
        .ok()
        .and_then(|c| c.parse::<u32>().ok())
        .is_some_and(|c| c > 0);
    for run in 0..=a.max_restarts {
        let resume = if run == 0 && !requeued { "0" } else { "1" };
        let args: Vec<String> = a.command[1..]
            .iter()
            .map(|s| s.replace("{resume}", resume))
            .collect();
        let mut env: Vec<(String, String)> = vec![
            ("MEMWATCH_RESUME".into(), resume.into()),
            ("MEMWATCH_RESTART".into(), run.to_string()),
            ("MEMWATCH_JOB".into(), name.into()),
            // Launch's marker: its own pid, which every process of the job descends from.
            ("MEMWATCH_LAUNCHED".into(), std::process::id().to_string()),
        ];
        env.extend(daemon.env.iter().cloned());
        if config_file.is_some() {
            env.push((
                "MEMWATCH_TOKEN_FILE".into(),
                token_file.to_string_lossy().into_owned(),
            ));
        }
        let exec = Exec::new(&a.command[0], &args, &env).map_err(anyhow::Error::from)?;
        let procs = match place {
            Place::Cgroup(cg) => cg.procs_files().map_err(anyhow::Error::from)?,
            Place::Scope => Vec::new(),
        };
        let oom_before = match place {
            Place::Cgroup(cg) => cg.oom_kills(),
            Place::Scope => 0,
        };
        let started = exec
            .start(&procs)
            .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", a.command[0]))?;
        let child = started.pid;
        // This run's scope, made around the child at its gate.
        let scope = match place {
            Place::Scope => match scope::start(&scope::unit_name(name, run), child, a.memory_max) {
                Ok(dir) => Some(JobCgroup::of_scope(dir)),
                Err(e) => {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(child as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    let _ = started.go().and_then(|p| p.wait());
                    return Err(anyhow::Error::from(e).into());
                }
            },
            Place::Cgroup(_) => None,
        };
        let cg = match (place, &scope) {
            (_, Some(s)) => s,
            (Place::Cgroup(cg), None) => cg,
            (Place::Scope, None) => unreachable!("a scope run has its scope"),
        };
        let launched = crate::job::Launched {
            run: run + 1,
            max_restarts: a.max_restarts,
            previous: account.clone(),
            lend: a.lend,
        };
        let attached = attach(
            &daemon.socket,
            a,
            Some(name),
            child,
            config_file.clone(),
            token_file,
            &launched,
        );
        // Open the gate either way: the job runs, attached or not.
        let status = started.go();
        if let Err(e) = attached {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = status.and_then(|p| p.wait());
            return Err(e);
        }
        let status = status
            .and_then(|p| p.wait())
            .map_err(|e| anyhow::anyhow!("waiting for the job: {e}"))?;
        let oom = cg.oom_kills().saturating_sub(oom_before);
        cg.kill_all();
        // memwatch stopped it (its way out's checkpoint step), or its trainer stopped at its floor
        // micro-batch after a CUDA OOM with a checkpoint saved: relaunched whatever the exit
        // status, since a trainer that saves on SIGTERM often exits 0, and one that stops on an OOM
        // often does not.
        let stopped = wait_detached(&daemon.socket, name)
            .into_iter()
            .find(|e| e.pid == child && (e.stopped_by_memwatch || e.cuda_oom_stop));
        let ended = match stopped {
            Some(e) => Ended::Stopped(e.how),
            None => describe(status, oom),
        };
        if let Some(code) = account_for(ended, run, a.max_restarts, &mut account, "") {
            return Ok(code);
        }
    }
    Ok(gave_up(&account, a.max_restarts))
}

/// Adds how run `run` (0 first) ended to `account` and says so: `Some(exit code)` when launch ends
/// here, `None` when it relaunches (`what` is what it relaunches, after "relaunching").
fn account_for(
    ended: Ended,
    run: u32,
    max_restarts: u32,
    account: &mut Vec<String>,
    what: &str,
) -> Option<u8> {
    match ended {
        Ended::Finished => {
            account.push(format!("run {}: finished", run + 1));
            eprintln!("memwatch launch: {}", account.join("; "));
            Some(0)
        }
        Ended::Failed(code) => {
            account.push(format!("run {}: exited with {code}", run + 1));
            eprintln!(
                "memwatch launch: {}; not relaunched (the job failed on its own)",
                account.join("; ")
            );
            Some(u8::try_from(code).unwrap_or(1))
        }
        Ended::Stopped(why) => {
            account.push(format!("run {}: stopped, {why}", run + 1));
            if run < max_restarts {
                eprintln!(
                    "memwatch launch: run {} stopped ({why}); relaunching{what} with {{resume}} = 1 ({} of {})",
                    run + 1,
                    run + 1,
                    max_restarts
                );
            }
            None
        }
    }
}

/// Launch's end after its last relaunch stopped too: said, and exit code 1.
fn gave_up(account: &[String], max_restarts: u32) -> u8 {
    eprintln!(
        "memwatch launch: {}; gave up after {} restart(s)",
        account.join("; "),
        max_restarts
    );
    1
}

/// Waits (at most 10 s) until the daemon no longer lists a job named `name` — it must have dropped
/// this run's job (and be done with its cgroup) before the next run joins that cgroup — and returns
/// the caller's jobs that ended, with how.
fn wait_detached(socket: &Path, name: &str) -> Vec<crate::job::EndedJob> {
    let mut ended = Vec::new();
    for _ in 0..100 {
        let r = crate::control::client::call(socket, &Request::Jobs {}).ok();
        let listed = r
            .as_ref()
            .and_then(|r| r.jobs.as_ref())
            .is_some_and(|jobs| jobs.iter().any(|j| j.name == name));
        ended = r.and_then(|r| r.ended).unwrap_or_default();
        if !listed {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ended
}

/// Attaches the waiting child (retrying while the previous run's job is still being dropped): the
/// job's name, as given or as the daemon chose it.
fn attach(
    socket: &Path,
    a: &LaunchArgs,
    name: Option<&str>,
    pid: u32,
    config_file: Option<PathBuf>,
    token_file: &Path,
    launched: &crate::job::Launched,
) -> Result<String, Failure> {
    let request = || Request::Attach {
        pid,
        itself: false,
        name: name.map(str::to_owned),
        config_file: config_file.clone(),
        profile: a.profile.clone(),
        keys: a.keys.clone(),
        launch: Some(launched.clone()),
    };
    let mut last = String::new();
    for _ in 0..50 {
        // The previous run's job is dropped at the daemon's next sample: until then its name is taken.
        let r = match crate::control::client::call(socket, &request()) {
            Ok(r) => r,
            // The name is still taken: a conflict that ends at the next sample.
            Err(e)
                if e.refusal()
                    .is_some_and(|r| r.kind == crate::control::ErrorKind::Conflict) =>
            {
                last = e.to_string();
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // `call` turns every refusal into an error: this is an accepted attach.
        if let Some(t) = r.token {
            std::fs::write(token_file, format!("{t}\n"))
                .map_err(|e| anyhow::anyhow!("{}: {e}", token_file.display()))?;
        }
        return Ok(r
            .job
            .map(|j| j.name)
            .or_else(|| name.map(str::to_owned))
            .unwrap_or_default());
    }
    Err(anyhow::anyhow!("cannot attach the job: {last}").into())
}

/// A command ready to fork and exec: everything the child needs is built before the fork, so that
/// between fork and exec it makes only async-signal-safe calls.
struct Exec {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

/// A started child, held at its gate until `go`.
struct Started {
    pid: u32,
    gate: Option<OwnedFd>,
}

/// A child let through its gate.
struct Running {
    pid: u32,
}

impl Exec {
    fn new(program: &str, args: &[String], env: &[(String, String)]) -> Result<Exec, LaunchError> {
        let c = |s: &str| CString::new(s).map_err(|_| LaunchError::NulByte(format!("{s:?}")));
        let path = if program.contains('/') {
            PathBuf::from(program)
        } else {
            std::env::var_os("PATH")
                .unwrap_or_default()
                .to_string_lossy()
                .split(':')
                .map(|d| Path::new(d).join(program))
                .find(|p| p.is_file())
                .ok_or_else(|| LaunchError::NotOnPath(program.to_owned()))?
        };
        let path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| LaunchError::NulByte(path.display().to_string()))?;
        let mut argv = vec![c(program)?];
        for a in args {
            argv.push(c(a)?);
        }
        let mut envp = Vec::new();
        for (k, v) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if env.iter().any(|(e, _)| *e == k) {
                continue;
            }
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_encoded_bytes());
            if let Ok(kv) = CString::new(kv) {
                envp.push(kv);
            }
        }
        for (k, v) in env {
            envp.push(c(&format!("{k}={v}"))?);
        }
        Ok(Exec { path, argv, envp })
    }

    /// Forks; the child writes itself into each of `procs` (the job's cgroup), waits at a gate until
    /// the parent has attached it, then execs. Returns the child held at the gate.
    fn start(&self, procs: &[CString]) -> std::io::Result<Started> {
        let (gate_read, gate_write) = nix::unistd::pipe()?;
        // The child says on this pipe that it is in its cgroup, before the parent attaches it.
        let (joined_read, joined_write) = nix::unistd::pipe()?;
        let mut argv: Vec<*const nix::libc::c_char> =
            self.argv.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const nix::libc::c_char> =
            self.envp.iter().map(|a| a.as_ptr()).collect();
        envp.push(std::ptr::null());
        // SAFETY: the child runs only async-signal-safe calls (getpid, open, write, close, read, execve,
        // _exit) on memory prepared before the fork, then execs or exits.
        match unsafe { nix::unistd::fork() }? {
            nix::unistd::ForkResult::Child => unsafe {
                let gate = gate_read.as_raw_fd();
                nix::libc::close(gate_write.as_raw_fd());
                nix::libc::close(joined_read.as_raw_fd());
                let pid = nix::libc::getpid();
                let mut digits = [0u8; 12];
                let mut n = pid as u32;
                let mut i = digits.len();
                loop {
                    i -= 1;
                    digits[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                for f in procs {
                    let fd =
                        nix::libc::open(f.as_ptr(), nix::libc::O_WRONLY | nix::libc::O_CLOEXEC);
                    if fd < 0
                        || nix::libc::write(fd, digits[i..].as_ptr().cast(), digits.len() - i) < 0
                    {
                        nix::libc::_exit(126);
                    }
                    nix::libc::close(fd);
                }
                let one = 1u8;
                nix::libc::write(joined_write.as_raw_fd(), (&raw const one).cast(), 1);
                nix::libc::close(joined_write.as_raw_fd());
                let mut b = 0u8;
                nix::libc::read(gate, (&raw mut b).cast(), 1);
                nix::libc::close(gate);
                nix::libc::execve(self.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
                nix::libc::_exit(127)
            },
            nix::unistd::ForkResult::Parent { child } => {
                drop(gate_read);
                drop(joined_write);
                let mut b = [0u8; 1];
                let joined = nix::unistd::read(&joined_read, &mut b).is_ok_and(|n| n == 1);
                if !joined {
                    let _ = nix::sys::wait::waitpid(child, None);
                    return Err(std::io::Error::other(
                        "it could not move itself into its cgroup",
                    ));
                }
                Ok(Started {
                    pid: child.as_raw() as u32,
                    gate: Some(gate_write),
                })
            }
        }
    }
}

impl Started {
    /// Opens the gate: the child execs.
    fn go(mut self) -> std::io::Result<Running> {
        drop(self.gate.take());
        Ok(Running { pid: self.pid })
    }
}

impl Running {
    fn wait(self) -> std::io::Result<std::process::ExitStatus> {
        use nix::sys::wait::{WaitStatus, waitpid};
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        loop {
            match waitpid(pid, None) {
                Ok(WaitStatus::Exited(_, code)) => {
                    return Ok(std::process::ExitStatus::from_raw((code & 0xff) << 8));
                }
                Ok(WaitStatus::Signaled(_, sig, _)) => {
                    return Ok(std::process::ExitStatus::from_raw(sig as i32));
                }
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The Slurm job this command runs in, if it runs in an allocation on a node where Slurm's cgroup
/// plugin made the job a cgroup.
fn slurm_allocation() -> Option<String> {
    let id = std::env::var("SLURM_JOB_ID").ok()?;
    crate::slurm::find_job(Path::new("/"), &id).map(|_| id)
}
