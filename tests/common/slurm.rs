//! A real single-node Slurm cluster for tests: munged, slurmctld and slurmd from Debian's packages,
//! started in the foreground with a generated slurm.conf (cgroup plugin on, v1 here), their own
//! munge key, socket and ports, and killed on drop. Client commands get `SLURM_CONF` explicitly.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::command::CommandError;
use super::{Daemon, Opts, bin, eventually};

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    /// The node's name; its cgroups are `slurm_<node>/…`.
    pub node: String,
    /// Wrappers that run scontrol and scancel against this cluster (for memwatch's `[slurm]`).
    pub scontrol: PathBuf,
    pub scancel: PathBuf,
    children: Vec<Child>,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Writes an executable script without this process ever holding it open for writing: a test on
/// another thread that forks meanwhile carries every descriptor of this process until its child's
/// exec, and an exec of the script while any descriptor has it open for writing fails with ETXTBSY
/// ("text file busy"). The text is staged beside it, and `install` (a child of its own) writes it.
pub fn script(path: &Path, text: &str) {
    let staged = path.with_file_name(format!(
        ".{}.staged",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::write(&staged, text).unwrap();
    let installed = std::process::Command::new("install")
        .args(["-m", "755"])
        .arg(&staged)
        .arg(path)
        .status()
        .unwrap();
    assert!(
        installed.success(),
        "install {}: {installed}",
        path.display()
    );
    std::fs::remove_file(&staged).unwrap();
}

/// Starts munged (its own key, socket, pid, log and seed file under `d`, logs in `d/log`) and, once its
/// socket exists, slurmctld in the foreground with `conf`.
pub fn munged_and_slurmctld(d: &Path, conf: &Path) -> (Child, Child) {
    let key = d.join("munge.key");
    std::fs::write(
        &key,
        (0..1024).map(|i| (i * 7 + 13) as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    let munged = Command::new("munged")
        .arg("-F")
        .arg(format!("--key-file={}", key.display()))
        .arg(format!("--socket={}/munge.sock", d.display()))
        .arg(format!("--pid-file={}/munged.pid", d.display()))
        .arg(format!("--log-file={}/log/munged.log", d.display()))
        .arg(format!("--seed-file={}/munge.seed", d.display()))
        .arg("--force")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start munged (apt-get install munge)");
    assert!(
        eventually(10.0, || d.join("munge.sock").exists()),
        "munged did not create its socket"
    );
    let ctld = Command::new("slurmctld")
        .args(["-D", "-i", "-f"])
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start slurmctld (apt-get install slurm-wlm)");
    (munged, ctld)
}

/// Whether a process is stopped: by a signal (state T), or frozen in its freezer cgroup (Slurm's
/// proctrack/cgroup suspends a step that way on v1; frozen tasks show state D).
pub fn stopped(pid: u32) -> bool {
    if super::proc_state(pid) == Some('T') {
        return true;
    }
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    cgroups.lines().any(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        controllers.split(',').any(|c| c == "freezer")
            && std::fs::read_to_string(format!("/sys/fs/cgroup/freezer{path}/freezer.state"))
                .is_ok_and(|s| s.trim() == "FROZEN")
    })
}

/// A process that ended (a dd that was ending as the job stopped or resumed).
pub fn gone(pid: u32) -> bool {
    super::proc_state(pid).is_none_or(|s| s == 'Z')
}

/// Makes room in a job's cgroup by emptying the tmpfs file its rank fills, then removes it: a
/// truncate frees the pages even while a writer the pause stopped mid-write still holds the file
/// open (an unlink alone would leave them charged until that writer closes it).
pub fn make_room(fill: &Path) {
    if let Ok(f) = std::fs::OpenOptions::new().write(true).open(fill) {
        let _ = f.set_len(0);
    }
    let _ = std::fs::remove_file(fill);
}

/// A file removed when the test ends, however it ends (a tmpfs file holds memory).
pub struct RemovedOnDrop(pub PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Cluster {
    /// Writes the configuration and the wrappers; nothing runs yet.
    pub fn prepare() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["state", "spool", "log"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let ctld_port = free_port();
        let node = format!("mw{}", free_port());
        let conf = d.join("slurm.conf");
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap()
            .trim()
            .to_owned();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=memwatchtest\n\
                 SlurmctldHost=localhost(127.0.0.1)\n\
                 SlurmctldPort={ctld_port}\n\
                 SlurmdPort={slurmd_port}\n\
                 SlurmUser=root\nSlurmdUser=root\n\
                 AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={d}/munge.sock\n\
                 StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd.log\n\
                 ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n\
                 SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\n\
                 SchedulerType=sched/builtin\nReturnToService=2\nMpiDefault=none\n\
                 JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 Prolog={d}/prolog.sh\nEpilog={d}/epilog.sh\n\
                 NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 CPUs=2 RealMemory=4096 State=UNKNOWN\n\
                 PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4\n",
                slurmd_port = free_port(),
                d = d.display(),
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("cgroup.conf"),
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n\
             ConstrainCores=no\nConstrainRAMSpace=yes\nConstrainSwapSpace=no\n",
        )
        .unwrap();
        let scontrol = d.join("scontrol");
        let scancel = d.join("scancel");
        for (path, prog) in [(&scontrol, "scontrol"), (&scancel, "scancel")] {
            script(
                path,
                &format!(
                    "#!/bin/sh\nSLURM_CONF={} exec /usr/bin/{prog} \"$@\"\n",
                    conf.display()
                ),
            );
        }
        Cluster {
            dir,
            conf,
            node,
            scontrol,
            scancel,
            children: Vec::new(),
        }
    }

    /// memwatch's `[slurm]` section for this cluster.
    pub fn memwatch_config(&self) -> String {
        format!(
            "[slurm]\nscontrol = {:?}\nscancel = {:?}\n",
            self.scontrol, self.scancel
        )
    }

    /// Starts munged, slurmctld and slurmd, with the repository's prolog and epilog run with `env`
    /// (MEMWATCH, MEMWATCH_SOCKET …); returns once the node is idle.
    pub fn start(&mut self, env: &[(&str, &str)]) {
        let d = self.dir.path().to_owned();
        let exports: String = env
            .iter()
            .map(|(k, v)| format!("export {k}='{v}'\n"))
            .collect();
        for which in ["prolog", "epilog"] {
            script(
                &d.join(format!("{which}.sh")),
                &format!(
                    "#!/bin/sh\n{exports}export SCONTROL={}\nexec {}/deploy/slurm/{which}.sh\n",
                    self.scontrol.display(),
                    super::repo().display()
                ),
            );
        }
        let (munged, ctld) = munged_and_slurmctld(&d, &self.conf);
        self.children.push(munged);
        self.children.push(ctld);
        let slurmd = Command::new("slurmd")
            .args(["-D", "-N", &self.node, "-f"])
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start slurmd");
        self.children.push(slurmd);
        let idle = || {
            self.run("sinfo", &["-h", "-o", "%T"])
                .is_ok_and(|s| s.trim() == "idle")
        };
        assert!(
            eventually(30.0, idle),
            "the node never became idle; slurmctld.log:\n{}\nslurmd.log:\n{}",
            self.log("slurmctld"),
            self.log("slurmd")
        );
    }

    /// Runs a Slurm client command against this cluster; its stdout, or its stderr as the error.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, CommandError> {
        super::command::output(program, args, |c| {
            c.env("SLURM_CONF", &self.conf);
        })
    }

    /// Submits a batch script; returns the job id.
    pub fn sbatch(&self, args: &[&str], script_text: &str) -> String {
        let path = self.dir.path().join(format!("job-{}.sh", free_port()));
        script(&path, script_text);
        let mut all: Vec<&str> = vec!["--parsable", "-o"];
        let out = format!("{}/job-%j.out", self.dir.path().display());
        all.push(&out);
        all.extend_from_slice(args);
        let path_s = path.to_string_lossy().into_owned();
        all.push(&path_s);
        let id = self.run("sbatch", &all).expect("sbatch");
        id.trim().split(';').next().unwrap_or_default().to_owned()
    }

    /// The job's state as squeue prints it (R, S, PD, CG …); empty once it left the queue.
    pub fn state(&self, id: &str) -> String {
        self.run("squeue", &["-h", "-j", id, "-o", "%t"])
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }

    /// Lets a requeued job run again now (Slurm holds a requeued job back with a BeginTime; a test
    /// does not wait for it), and waits until the last line of `out`, which the job's runs append
    /// to, is `line`. Panics, saying what `out` holds, if it is not.
    pub fn run_requeued(&self, id: &str, out: &Path, line: &str) {
        assert!(
            eventually(30.0, || self.state(id) == "PD"),
            "job {id} was not requeued (state {:?})",
            self.state(id)
        );
        let _ = self.run(
            "scontrol",
            &["update", &format!("JobId={id}"), "StartTime=now"],
        );
        assert!(
            eventually(60.0, || std::fs::read_to_string(out)
                .is_ok_and(|t| t.lines().last() == Some(line))),
            "the requeued job {id} did not run again with {line:?}: {:?} (state {:?})",
            std::fs::read_to_string(out),
            self.state(id)
        );
    }

    /// The job's cgroup directory on this node (memory controller, v1).
    pub fn job_cgroup(&self, id: &str) -> PathBuf {
        PathBuf::from(format!(
            "/sys/fs/cgroup/memory/slurm_{}/uid_0/job_{id}",
            self.node
        ))
    }

    /// A daemon's log, for failure messages.
    pub fn log(&self, which: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("log/{which}.log")))
            .unwrap_or_default()
    }
}

impl Cluster {
    /// Every process left in this node's Slurm cgroups.
    fn leftovers(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for controller in ["memory", "freezer", "cpuset", "devices"] {
            let top = PathBuf::from(format!("/sys/fs/cgroup/{controller}/slurm_{}", self.node));
            let mut stack = vec![top];
            while let Some(dir) = stack.pop() {
                if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    out.extend(t.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
                }
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Jobs first, so that no task outlives the cluster; what Slurm leaves is killed, and the
        // node's cgroups are removed.
        let _ = self.run("scancel", &["--full", "-u", "root"]);
        eventually(15.0, || self.leftovers().is_empty());
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for pid in self.leftovers() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        eventually(5.0, || self.leftovers().is_empty());
        for controller in ["memory", "freezer", "cpuset", "devices"] {
            let top = PathBuf::from(format!("/sys/fs/cgroup/{controller}/slurm_{}", self.node));
            let _ = Command::new("find")
                .arg(&top)
                .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", ";"])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A cluster whose prolog and epilog talk to a fresh daemon (`extra`: more of its config; `env`: more
/// of the prolog's environment).
pub fn cluster_and_daemon(extra: &str, env: &[(&str, &str)]) -> (Cluster, Daemon) {
    cluster_and_daemon_with(|c| format!("{}{extra}", c.memwatch_config()), env)
}

/// The same with the daemon's whole config made from the prepared cluster.
pub fn cluster_and_daemon_with(
    config: impl FnOnce(&Cluster) -> String,
    env: &[(&str, &str)],
) -> (Cluster, Daemon) {
    let mut cluster = Cluster::prepare();
    let config = config(&cluster);
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 100,
        extra_config: &config,
        ..Opts::default()
    });
    let memwatch = bin();
    let mut all = vec![
        ("MEMWATCH", memwatch.to_str().unwrap()),
        ("MEMWATCH_SOCKET", d.socket.to_str().unwrap()),
    ];
    all.extend_from_slice(env);
    cluster.start(&all);
    (cluster, d)
}

/// Whether daemon `d` holds job `name` paused through Slurm (`scontrol suspend`), its pause held.
pub fn held_through_slurm(d: &super::Daemon, name: &str) -> bool {
    d.jobs().iter().any(|j| {
        j["name"] == name
            && j["pause"]["mechanism"]["kind"] == "slurm_suspend"
            && j["pause"]["phase"] == "held"
    })
}
