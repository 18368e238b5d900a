//! Attacks by an unprivileged local user on what memwatch reads and writes for them: a YAML alias bomb
//! as a job's config (at attach, and swapped in afterwards), a 100 MB config, and a directory swapped
//! under root's `memwatch rewrite` to point it at a root-owned file. Each runs against the real daemon
//! or the real CLI, as the user.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{Daemon, Opts, eventually, memwatch};

const USER: &str = "memwatch-attack";

/// A directory the user owns, inside a test temp dir everyone may enter.
fn user_dir(uid: u32) -> (tempfile::TempDir, PathBuf) {
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = top.path().join("user");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(uid), Some(common::gid_of(uid))).unwrap();
    (top, dir)
}

/// Writes `text` to `path` as the user's file.
fn user_file(path: &Path, text: &[u8], uid: u32) {
    std::fs::write(path, text).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(common::gid_of(uid))).unwrap();
}

/// Runs memwatch as the user.
fn as_user(args: &[&str]) -> (i32, String) {
    let out = Command::new("runuser")
        .args(["-u", USER, "--"])
        .arg(common::bin())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `memwatch attach PID --config-file FILE --profile PROFILE` as the user.
fn attach_as_user(pid: &str, file: &Path, profile: &str, socket: &str) -> (i32, String) {
    as_user(&[
        "attach",
        pid,
        "--config-file",
        file.to_str().unwrap(),
        "--profile",
        profile,
        "--socket",
        socket,
    ])
}

fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

fn rss_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

/// The "billion laughs": 373 bytes that expand to 9^9 strings.
fn alias_bomb() -> String {
    include_str!("fixtures/alias-bomb.yaml").to_owned()
}

fn open_daemon() -> Daemon {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    d.open_to_everyone();
    d
}

#[test]
fn an_alias_bomb_is_refused_and_the_daemon_stays_small() {
    let uid = common::ensure_user(USER);
    let d = open_daemon();
    let (_top, dir) = user_dir(uid);
    let bomb = alias_bomb();
    let socket = d.socket.to_str().unwrap().to_owned();
    let job = common::spawn_as(uid, &["sleep", "120"]);
    let pid = job.id().to_string();
    let file = dir.join("train.yaml");

    // At attach: refused with a clear error.
    user_file(&file, bomb.as_bytes(), uid);
    let (code, err) = attach_as_user(&pid, &file, "hf", &socket);
    assert_ne!(code, 0);
    assert!(err.contains("aliases"), "{err}");
    assert!(d.jobs().is_empty());

    // Swapped in after a harmless attach: every read of it fails cleanly; the daemon lives on.
    user_file(&file, b"per_device_train_batch_size: 8\n", uid);
    let (code, err) = as_user(&[
        "attach",
        &pid,
        "--name",
        "laughs",
        "--config-file",
        file.to_str().unwrap(),
        "--profile",
        "hf",
        "--socket",
        &socket,
    ]);
    assert_eq!(code, 0, "{err}");
    let tmp = dir.join(".swap");
    user_file(&tmp, bomb.as_bytes(), uid);
    std::fs::rename(&tmp, &file).unwrap();
    // The error is the owner's to read (root's `memwatch jobs --json` here).
    assert!(
        eventually(10.0, || d.jobs().first().is_some_and(|j| {
            j["config"]["last_error"]
                .as_str()
                .is_some_and(|s| s.contains("cannot read the config") && s.contains("aliases"))
        })),
        "no clear error for the swapped-in bomb: {:?}",
        d.jobs()
    );
    let peak = rss_mib(d.child.id());
    eprintln!("the daemon's peak RSS after the bomb: {peak} MiB");
    assert!(peak < 64, "peak RSS {peak} MiB");
    assert_eq!(d.job_state("laughs").as_deref(), Some("running"));

    // memwatch rewrite on it, as the user: refused at once, in bounded memory.
    let out = Command::new("runuser")
        .args(["-u", USER, "--"])
        .arg(common::bin())
        .args([
            "rewrite",
            file.to_str().unwrap(),
            "--set",
            "per_device_train_batch_size=4",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("aliases"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), bomb);
    stop(job);
}

#[test]
fn a_100_mb_config_is_refused_whole_and_left_untouched() {
    let uid = common::ensure_user(USER);
    let d = open_daemon();
    let (_top, dir) = user_dir(uid);
    let socket = d.socket.to_str().unwrap().to_owned();
    let job = common::spawn_as(uid, &["sleep", "120"]);
    let pid = job.id().to_string();
    for (name, head, tail) in [
        (
            "big.yaml",
            "per_device_train_batch_size: 8\npad: \"",
            "\"\nlast: 1\n",
        ),
        (
            "big.json",
            "{\"train_micro_batch_size_per_gpu\": 4, \"pad\": \"",
            "\", \"last\": 1}\n",
        ),
    ] {
        let file = dir.join(name);
        let mut text = head.as_bytes().to_vec();
        text.resize(100 << 20, b'x');
        text.extend_from_slice(tail.as_bytes());
        user_file(&file, &text, uid);
        let profile = if name.ends_with("yaml") {
            "hf"
        } else {
            "deepspeed"
        };
        let (code, err) = attach_as_user(&pid, &file, profile, &socket);
        assert_ne!(code, 0, "{name}");
        assert!(err.contains("at most 4194304 bytes"), "{name}: {err}");
        let key = if profile == "hf" {
            "per_device_train_batch_size=4"
        } else {
            "train_micro_batch_size_per_gpu=2"
        };
        let (code, err) = as_user(&["rewrite", file.to_str().unwrap(), "--set", key]);
        assert_eq!(code, 1, "{name}: {err}");
        assert!(err.contains("left it untouched"), "{name}: {err}");
        assert!(std::fs::read(&file).unwrap() == text, "{name} changed");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("memwatch"))
            .collect();
        assert!(left.is_empty(), "{name}: left {left:?}");
        std::fs::remove_file(&file).unwrap();
    }
    assert!(d.jobs().is_empty());
    assert!(rss_mib(d.child.id()) < 64);
    stop(job);
}

/// The swap, as the user runs it: `DIR/a` is a symlink that flips between the user's own directory
/// and root's private one, as fast as it can, until killed.
const SWAP: &str = r#"
import os, sys
base, decoy = sys.argv[1], sys.argv[2]
real = os.path.join(base, "real")
i = 0
while True:
    tmp = os.path.join(base, ".l%d" % (i % 2))
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(decoy if i % 2 else real, tmp)
    os.replace(tmp, os.path.join(base, "a"))
    i += 1
"#;

#[test]
fn a_directory_swapped_under_roots_rewrite_never_reaches_a_root_file() {
    let uid = common::ensure_user(USER);
    let (_top, dir) = user_dir(uid);
    let real = dir.join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::chown(&real, Some(uid), Some(common::gid_of(uid))).unwrap();
    let config = b"{\"train_micro_batch_size_per_gpu\": 4}\n";
    user_file(&real.join("cfg.json"), config, uid);
    // Root's private directory with a file of the same name.
    let decoy_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(decoy_dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let decoy = decoy_dir.path().join("cfg.json");
    std::fs::write(&decoy, config).unwrap();
    std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o600)).unwrap();
    let decoy_before = std::fs::metadata(&decoy).unwrap();

    // setpriv execs the script itself, so killing the child stops the swap (also when a check fails).
    struct Swap(Child);
    impl Drop for Swap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let swap = Swap(
        common::command_as(uid)
            .args(["/usr/bin/python3", "-c", SWAP])
            .arg(&dir)
            .arg(decoy_dir.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let target = dir.join("a").join("cfg.json");
    assert!(eventually(30.0, || dir.join("a").exists()));
    let (mut rewritten, mut refused) = (0, 0);
    let runs = 400;
    for i in 0..runs {
        let value = format!("train_micro_batch_size_per_gpu={}", 1 + i % 7);
        let (code, out, err) = memwatch(&["rewrite", target.to_str().unwrap(), "--set", &value]);
        match code {
            0 => rewritten += 1,
            _ => {
                refused += 1;
                assert!(!err.trim().is_empty() && !err.contains("panicked"), "{err}");
            }
        }
        let _ = out;
    }
    drop(swap);
    eprintln!(
        "{runs} runs of root's rewrite under the swap: {rewritten} rewrote the user's file, {refused} refused"
    );
    let after = std::fs::metadata(&decoy).unwrap();
    assert_eq!(
        std::fs::read(&decoy).unwrap(),
        config,
        "root's file was rewritten"
    );
    assert_eq!(
        (after.ino(), after.mtime_nsec(), after.uid(), after.mode()),
        (
            decoy_before.ino(),
            decoy_before.mtime_nsec(),
            decoy_before.uid(),
            decoy_before.mode()
        )
    );
    let in_root_dir: Vec<_> = std::fs::read_dir(decoy_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        in_root_dir,
        vec![std::ffi::OsString::from("cfg.json")],
        "files appeared in root's directory"
    );
    // Whatever memwatch made in the user's directory is the user's.
    for e in std::fs::read_dir(&real).unwrap() {
        let e = e.unwrap();
        assert_eq!(
            e.metadata().unwrap().uid(),
            uid,
            "{:?} is not the user's",
            e.path()
        );
    }
    assert!(
        rewritten > 0,
        "the swap never let a rewrite through: the test tested nothing"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(real.join("cfg.json")).unwrap()).unwrap();
    assert!(v["train_micro_batch_size_per_gpu"].is_u64());
}
