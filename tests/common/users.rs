//! The local users the tests act as: made once (scripts/test-users.sh, or here under a lock), and
//! processes run as them with their own uid and primary group.

use std::process::{Child, Command};

/// The users the tests act as, made once before any test runs by `scripts/test-users.sh`.
pub const TEST_USERS: [&str; 4] = [
    "memwatch-test",
    "memwatch-attack",
    "memwatch-flood",
    "memwatch-slow",
];

/// Creates the local user `name` if missing (needs root and useradd); returns its uid.
///
/// scripts/test.sh makes every user of [`TEST_USERS`] before any test runs; this covers a test binary
/// run on its own. Creation is serialised across threads and test processes (a lock file), so two
/// tests never race two `useradd` runs for one name; the uid is read back after the lock.
pub fn ensure_user(name: &str) -> u32 {
    use nix::fcntl::{Flock, FlockArg};
    static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _thread = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join("memwatch-test-users.lock"))
        .expect("the users' lock file");
    let _process = Flock::lock(file, FlockArg::LockExclusive).expect("lock the users' lock file");
    if nix::unistd::User::from_name(name).ok().flatten().is_none() {
        let out = Command::new("useradd")
            .args([
                "--no-create-home",
                "--user-group",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .output()
            .expect("useradd (needs root)");
        assert!(
            out.status.success(),
            "cannot create user {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("user {name} missing after useradd"))
        .uid
        .as_raw()
}

/// The primary group of the user with `uid`.
pub fn gid_of(uid: u32) -> u32 {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no user with uid {uid}"))
        .gid
        .as_raw()
}

/// A command that runs as user `uid` with that user's own primary group (real, effective and saved
/// ids, no supplementary groups): `setpriv` execs what the caller adds.
pub fn command_as(uid: u32) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={uid}"),
        &format!("--regid={}", gid_of(uid)),
        "--clear-groups",
    ]);
    c
}

/// Runs `args` as user `uid` (see [`command_as`]).
pub fn spawn_as(uid: u32, args: &[&str]) -> Child {
    command_as(uid).args(args).spawn().unwrap()
}
