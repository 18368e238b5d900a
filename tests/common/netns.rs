//! Machines on this one machine, for tests that need more than one host: each is a network, UTS and
//! mount namespace held by a process of its own (`unshare … cat`, which ends when the test process
//! does, its stdin closing), with its own hostname, its own `/etc/hosts` (bind-mounted in its mount
//! namespace), and an address on a bridge in the root namespace through a veth pair. A directory
//! may be hidden from a machine (an empty directory mounted over it), as another machine's cgroups
//! would be. Programs run in a machine through `nsenter` ([`Machine::enter`]).
//!
//! Names are unique per test process (`mwb<pid><n>` for the bridge, `mwv<pid><n>…` for the veths,
//! a /24 of 10.213.0.0/16 no interface here uses), and everything is removed on drop; a killed
//! run leaves the bridge and the veths, which `scripts/ci-clean.sh` removes by these names.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::command::CommandError;
use super::eventually;

/// Runs a command; its stdout, or what went wrong as the error.
pub fn sh(program: &str, args: &[&str]) -> Result<String, CommandError> {
    super::command::output(program, args, |_| {})
}

/// Runs a command that must succeed (setting up the network); panics saying which failed.
fn must(program: &str, args: &[&str]) -> String {
    sh(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// A bridge in the root namespace and its /24; the machines joined to it.
pub struct Net {
    /// Unique per test process and net: `mw<pid><letter>`.
    pub tag: String,
    pub bridge: String,
    /// The bridge's own address (x.x.x.1): the root namespace's on this net.
    pub gateway: Ipv4Addr,
    prefix: [u8; 3],
    machines: usize,
}

impl Net {
    /// A fresh bridge with an unused 10.213.N.0/24; panics if this cannot be made (needs root).
    pub fn new() -> Net {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let letter = char::from(b'a' + (n % 26) as u8);
        let tag = format!("mw{pid}{letter}");
        let bridge = format!("mwb{pid}{letter}");
        let used = must("ip", &["-o", "-4", "addr", "show"]);
        let start = (pid as usize * 7 + n) % 250;
        let third = (0..250)
            .map(|i| ((start + i) % 250) as u8)
            .find(|t| !used.contains(&format!(" 10.213.{t}.")))
            .expect("a free /24 in 10.213.0.0/16");
        let prefix = [10, 213, third];
        let mut net = Net {
            tag,
            bridge: String::new(),
            gateway: Ipv4Addr::new(10, 213, third, 1),
            prefix,
            machines: 0,
        };
        must("ip", &["link", "add", &bridge, "type", "bridge"]);
        net.bridge = bridge;
        must(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", net.gateway),
                "dev",
                &net.bridge,
            ],
        );
        must("ip", &["link", "set", &net.bridge, "up"]);
        net
    }

    /// A new machine on this net: hostname `name`, the next address; `dir` keeps its files.
    pub fn machine(&mut self, name: &str, dir: &Path) -> Machine {
        self.machines += 1;
        let n = self.machines;
        let [a, b, c] = self.prefix;
        let addr = Ipv4Addr::new(a, b, c, 1 + n as u8);
        let veth = format!("mwv{}{n}", &self.tag[2..]);
        let peer = format!("{veth}p");
        let holder = Command::new("unshare")
            .args([
                "--net",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "cat",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start unshare (util-linux)");
        let mut m = Machine {
            name: name.to_owned(),
            addr,
            holder,
            veth: String::new(),
            dir: dir.to_owned(),
        };
        let pid = m.pid();
        assert!(
            eventually(10.0, || std::fs::read_to_string(format!(
                "/proc/{pid}/comm"
            ))
            .is_ok_and(|c| c.trim() == "cat")),
            "unshare did not make the namespaces of {name}"
        );
        must(
            "ip",
            &["link", "add", &veth, "type", "veth", "peer", "name", &peer],
        );
        m.veth = veth.clone();
        must("ip", &["link", "set", &peer, "netns", &pid.to_string()]);
        must("ip", &["link", "set", &veth, "master", &self.bridge]);
        must("ip", &["link", "set", &veth, "up"]);
        let inside = format!(
            "ip link set lo up && ip link set {peer} name eth0 && ip addr add {addr}/24 dev eth0 \
             && ip link set eth0 up && hostname {name}"
        );
        m.run("sh", &["-c", &inside])
            .unwrap_or_else(|e| panic!("setting up {name}'s network: {e}"));
        m
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if !self.bridge.is_empty() {
            let _ = sh("ip", &["link", "del", &self.bridge]);
        }
    }
}

/// One machine: its namespaces, held by `unshare … cat` until drop.
pub struct Machine {
    pub name: String,
    pub addr: Ipv4Addr,
    holder: Child,
    /// The root namespace's end of its veth pair.
    veth: String,
    dir: PathBuf,
}

impl Machine {
    /// The process holding its namespaces.
    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    /// The command line that runs a program in this machine: `nsenter …`, then the program and its
    /// arguments (nsenter execs it, so the child's pid is the program's).
    pub fn enter(&self) -> Vec<String> {
        [
            "nsenter",
            "-t",
            &self.pid().to_string(),
            "--net",
            "--uts",
            "--mount",
            "--",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Runs a command in this machine; its stdout, or what went wrong.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, CommandError> {
        let enter = self.enter();
        let mut all: Vec<&str> = enter[1..].iter().map(String::as_str).collect();
        all.push(program);
        all.extend_from_slice(args);
        sh("nsenter", &all)
    }

    /// Gives it `text` as its /etc/hosts.
    pub fn hosts(&self, text: &str) {
        let file = self.dir.join(format!("hosts-{}", self.name));
        std::fs::write(&file, text).unwrap();
        self.run("mount", &["--bind", &file.to_string_lossy(), "/etc/hosts"])
            .unwrap_or_else(|e| panic!("{}'s /etc/hosts: {e}", self.name));
    }

    /// Hides directory `dir` (made if missing) from this machine: an empty directory is mounted
    /// over it in its mount namespace.
    pub fn hide(&self, dir: &Path) {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("make {} to hide it: {e}", dir.display()));
        let empty = self.dir.join(format!("empty-{}", self.name));
        std::fs::create_dir_all(&empty).unwrap();
        self.run(
            "mount",
            &["--bind", &empty.to_string_lossy(), &dir.to_string_lossy()],
        )
        .unwrap_or_else(|e| panic!("hide {} from {}: {e}", dir.display(), self.name));
    }
}

impl Drop for Machine {
    /// Ends the holder; the namespaces go with the last process in them, the veth pair with the
    /// network namespace, or at once here when something still holds it.
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        if !self.veth.is_empty() {
            let _ = sh("ip", &["link", "del", &self.veth]);
        }
    }
}
