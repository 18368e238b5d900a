//! Writing a file of a cgroup delegated to a user. A user's systemd manager (`systemd-run --user`,
//! the user's `app.slice`) or a rootless container runtime makes its cgroups as that user, so their
//! files (`cgroup.freeze`, `memory.pressure`) are the user's, mode 0644: root may write them only with
//! `CAP_DAC_OVERRIDE`, which memwatch's unit does not hold. Such a file is opened with its owner's
//! rights instead: the calling thread's filesystem uid and gid are the file's for that one `open` and
//! root's again at once (`setfsuid` is per thread, so no other thread ever runs with them).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// Opens `path` for writing (and reading, with `read`), as root when root may, else — when the
/// daemon runs as root and the file belongs to another user — with the file owner's rights.
pub fn open_write(path: &Path, read: bool, flags: i32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let open = || {
        OpenOptions::new()
            .read(read)
            .write(true)
            .custom_flags(flags)
            .open(path)
    };
    match open() {
        Err(e)
            if e.kind() == io::ErrorKind::PermissionDenied && nix::unistd::geteuid().is_root() =>
        {
            let meta = std::fs::metadata(path)?;
            if meta.uid() == 0 {
                return Err(e);
            }
            as_owner(meta.uid(), meta.gid(), open)
        }
        other => other,
    }
}

/// Runs `f` with this thread's filesystem ids set to `uid` and `gid`, then set back to root's.
fn as_owner<T>(uid: u32, gid: u32, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    /// Puts root's filesystem ids back however `f` ends.
    struct Back;
    impl Drop for Back {
        fn drop(&mut self) {
            set_fs_ids(0, 0);
        }
    }
    let _back = Back;
    if !set_fs_ids(uid, gid) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("cannot take the rights of uid {uid}, which owns the file (no CAP_SETUID?)"),
        ));
    }
    f()
}

/// Sets this thread's filesystem uid and gid (`setfsuid` and `setfsgid` are per thread); whether
/// both took.
pub fn set_fs_ids(uid: u32, gid: u32) -> bool {
    use nix::unistd::{Gid, Uid, setfsgid, setfsuid};
    setfsgid(Gid::from_raw(gid));
    setfsuid(Uid::from_raw(uid));
    // Each answers the previous value: asking again tells whether the change took.
    setfsuid(Uid::from_raw(uid)).as_raw() == uid && setfsgid(Gid::from_raw(gid)).as_raw() == gid
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// This thread's effective capabilities without those that let root write another user's file.
    fn without_dac_override() {
        let mut caps = rustix::thread::capabilities(None).expect("read the thread's capabilities");
        caps.effective -=
            rustix::thread::CapabilitySet::DAC_OVERRIDE | rustix::thread::CapabilitySet::FOWNER;
        rustix::thread::set_capabilities(None, caps).expect("drop CAP_DAC_OVERRIDE");
    }

    #[test]
    fn root_without_dac_override_writes_a_users_file_with_the_users_rights() {
        if !nix::unistd::geteuid().is_root() {
            crate::test_skip::cannot_run("delegated", "needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cgroup.freeze");
        std::fs::write(&file, "0").unwrap();
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        let mine = dir.path().join("after");
        let file2 = file.clone();
        let mine2 = mine.clone();
        // A thread of its own: its capabilities change, the test runner's do not.
        std::thread::spawn(move || {
            without_dac_override();
            let plain = OpenOptions::new().write(true).open(&file2);
            assert_eq!(
                plain.map(|_| ()).map_err(|e| e.kind()),
                Err(io::ErrorKind::PermissionDenied),
                "the set-up must refuse root a plain open"
            );
            open_write(&file2, false, 0)
                .expect("opened with the owner's rights")
                .write_all(b"1")
                .unwrap();
            // Root's filesystem ids are back: what this thread makes now is root's.
            std::fs::write(&mine2, "x").unwrap();
        })
        .join()
        .unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "1");
        assert_eq!(std::fs::metadata(&file).unwrap().uid(), 65534);
        assert_eq!(std::fs::metadata(&mine).unwrap().uid(), 0);
    }

    #[test]
    fn a_file_root_owns_and_may_not_write_stays_refused() {
        if !nix::unistd::geteuid().is_root() {
            crate::test_skip::cannot_run("delegated", "needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ro");
        std::fs::write(&file, "0").unwrap();
        let file2 = file.clone();
        std::thread::spawn(move || {
            std::fs::set_permissions(&file2, std::os::unix::fs::PermissionsExt::from_mode(0o444))
                .unwrap();
            without_dac_override();
            let e = open_write(&file2, false, 0).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        })
        .join()
        .unwrap();
    }
}
