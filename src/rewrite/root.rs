//! Paths walked one component at a time, with the kernel never following a link: what
//! `write.rs` opens a root-owned file's directory by, and how a path inside a job's root (its
//! container's) is opened where openat2's `RESOLVE_IN_ROOT` is missing.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// Pushes `p`'s components onto `todo`, last first (so that popping walks them in order); `..` kept.
pub(super) fn push_all(todo: &mut Vec<OsString>, p: &Path) {
    for c in p.components().rev() {
        match c {
            Component::Normal(n) => todo.push(n.to_owned()),
            Component::ParentDir => todo.push("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
}

/// Opens directory `path` under `root` as `RESOLVE_IN_ROOT` would: one component at a time, never
/// following a link by the kernel; a link's target is walked from `root` when absolute, and `..`
/// never climbs above `root`.
pub(super) fn walk_in_root(root: &OwnedFd, path: &Path) -> Result<OwnedFd, Errno> {
    let here = |fd: &OwnedFd| {
        rustix::fs::openat(
            fd,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let mut stack = vec![here(root)?];
    let mut todo: Vec<OsString> = Vec::new();
    push_all(&mut todo, path);
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let cur = stack.last().ok_or(Errno::NOENT)?;
        let next = rustix::fs::openat(
            cur,
            name.as_os_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&next)?;
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::Directory => stack.push(next),
            rustix::fs::FileType::Symlink => {
                links += 1;
                if links > 40 {
                    return Err(Errno::LOOP);
                }
                let target = rustix::fs::readlinkat(&next, "", Vec::new())?;
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    stack.truncate(1);
                }
                push_all(&mut todo, &target);
            }
            _ => return Err(Errno::NOTDIR),
        }
    }
    let cur = stack.last().ok_or(Errno::NOENT)?;
    rustix::fs::openat(
        cur,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk by hand that stands in for openat2's `RESOLVE_IN_ROOT` keeps every path inside the root:
    /// `..` stops at it, an absolute link is read from it, and a link out of it leads nowhere outside.
    #[test]
    fn a_walk_in_a_root_never_leaves_it() {
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(top.path().join("outside")).unwrap();
        std::os::unix::fs::symlink("/a/b", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../..", root.join("a/up")).unwrap();
        std::os::unix::fs::symlink("../outside", root.join("out")).unwrap();
        let rfd = rustix::fs::open(
            &root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let ino = |fd: &OwnedFd| rustix::fs::fstat(fd).unwrap().st_ino;
        let of = |p: &Path| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        let ab = of(&root.join("a/b")).unwrap();
        assert_eq!(ino(&walk_in_root(&rfd, Path::new("a/b")).unwrap()), ab);
        assert_eq!(ino(&walk_in_root(&rfd, Path::new("abs")).unwrap()), ab);
        assert_eq!(
            ino(&walk_in_root(&rfd, Path::new("a/up/a/b")).unwrap()),
            ab,
            "`..` stops at the root"
        );
        assert_eq!(
            ino(&walk_in_root(&rfd, Path::new("../../a")).unwrap()),
            of(&root.join("a")).unwrap()
        );
        assert_eq!(
            walk_in_root(&rfd, Path::new("out")).unwrap_err(),
            Errno::NOENT,
            "the root's own ../outside, which it does not have"
        );
    }
}
