//! Reading and writing a training config safely, for its owner.
//!
//! - Every file operation runs on a thread of its own that holds exactly the file owner's rights:
//!   filesystem uid set to the owner's, supplementary groups dropped (`setfsuid` and a per-thread
//!   `setgroups`). memwatch can read or write nothing the owner could not, a path the owner cannot
//!   reach answers "permission denied" whether or not the file exists, and no root-owned file is
//!   left in a user's directory.
//! - The directory is opened once; the file, the temp file and the backup are all reached relative to
//!   it, the file through `O_NOFOLLOW`, its ownership checked on the opened descriptor.
//! - Run as root by hand (`memwatch rewrite`), the owner is the opened file's; a root-owned file is
//!   rewritten only when every directory and link on its path is root's, so no user can swap one in.
//! - Files over [`MAX_BYTES`] are refused whole, never cut.
//! - The original is kept once as `<file>.memwatch-orig`, written to a temp file and renamed without
//!   replacing, so it is whole or absent. The new text goes to a temp file with the original's mode,
//!   is fsynced, and, if the file is still byte for byte the one read (same inode, size, mtime and
//!   content), renamed over it; then the directory is fsynced. A file changed in between is read again
//!   and the edit redone (three tries), so an owner's save is never overwritten. A crash at any point
//!   leaves the old file or the new one; temp files a crash left behind are removed on the next write.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::root::push_all;
use super::{ContentError, Format, Scalar, apply_parsed, parse};

pub use memwatch_core::rewrite::file::{MAX_BYTES, RewriteError, TRIES};

/// What a rewrite changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Each edited path with its previous value.
    pub before: Before,
    /// The copy of the file as it was before memwatch's first rewrite.
    pub backup: PathBuf,
    /// How many times the file changed under memwatch and was read again.
    pub retries: u32,
}

/// Whose file it is, and how its directory is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The file must be this user's; its directory is opened with that user's rights.
    Uid(u32),
    /// Root by hand: the owner is the file's own, found on the opened descriptor; the directory is
    /// reached with root's rights, noting whether every directory and link on the way is root's.
    FileOwner,
    /// As `Uid`, the path inside the root of process `pid` (a container's mount namespace):
    /// `/proc/PID/root` opened with the owner's rights (which the kernel grants only to who may
    /// ptrace the process), the directory resolved under it with `RESOLVE_IN_ROOT`, so `..` and
    /// absolute links stay inside.
    Within {
        /// The file's owner.
        uid: u32,
        /// The process whose root the path is in.
        pid: u32,
    },
}

impl Owner {
    /// User `uid`'s file, its path in the daemon's root or in that of process `within`.
    pub fn of(uid: u32, within: Option<u32>) -> Owner {
        match within {
            Some(pid) => Owner::Within { uid, pid },
            None => Owner::Uid(uid),
        }
    }
}

/// One config file operation at a time, process-wide: it bounds the memory config work can take.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> RewriteError + '_ {
    move |source| RewriteError::Io {
        path: path.to_owned(),
        source,
    }
}

fn errno(path: &Path) -> impl Fn(Errno) -> RewriteError + '_ {
    move |e| RewriteError::Io {
        path: path.to_owned(),
        source: e.into(),
    }
}

/// The group with no rights of its own (`nogroup`), held while nothing is known of the file.
const NO_GROUP: u32 = 65534;

/// Runs `f` on a fresh thread whose filesystem uid is `uid`, filesystem gid `gid`, and (when the
/// daemon runs as root) with no supplementary groups. The thread's other credentials are untouched.
fn as_user<T: Send>(
    uid: u32,
    gid: u32,
    f: impl FnOnce() -> Result<T, RewriteError> + Send,
) -> Result<T, RewriteError> {
    std::thread::scope(|s| {
        s.spawn(move || {
            if nix::unistd::geteuid().is_root() {
                // The raw per-thread call: glibc's setgroups would change every thread.
                rustix::thread::set_thread_groups(&[]).map_err(|e| RewriteError::Io {
                    path: PathBuf::new(),
                    source: std::io::Error::other(format!("cannot drop supplementary groups: {e}")),
                })?;
            }
            set_fs_ids(uid, gid)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(RewriteError::Io {
                path: PathBuf::new(),
                source: std::io::Error::other("the config thread panicked"),
            })
        })
    })
}

/// Sets this thread's filesystem uid and gid, checking that both took. Run by a user other than root,
/// memwatch has that user's rights already and changes nothing.
fn set_fs_ids(uid: u32, gid: u32) -> Result<(), RewriteError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    if !crate::delegated::set_fs_ids(uid, gid) {
        return Err(RewriteError::Io {
            path: PathBuf::new(),
            source: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "cannot take the file owner's rights (uid {uid}); run the daemon as root or as that user"
                ),
            ),
        });
    }
    Ok(())
}

/// The directory and the file name of an absolute path.
fn split(path: &Path) -> Result<(&Path, &std::ffi::OsStr), RewriteError> {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if path.is_absolute() => Ok((dir, name)),
        _ => Err(RewriteError::NotAbsolute(path.to_owned())),
    }
}

/// Opens `dir` with root's rights, following links, and tells whether every directory and link on
/// the way is root's (so that no other user could have swapped one in).
fn open_dir_tracking_trust(dir: &Path) -> Result<(OwnedFd, bool), RewriteError> {
    let err = errno(dir);
    let mut trusted = true;
    let mut cur = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(&err)?;
    let mut todo: Vec<OsString> = Vec::new();
    push_all(&mut todo, dir);
    let mut links = 0;
    while let Some(name) = todo.pop() {
        let next = rustix::fs::openat(
            &cur,
            name.as_os_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(&err)?;
        let st = rustix::fs::fstat(&next).map_err(&err)?;
        trusted &= st.st_uid == 0;
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        if kind == rustix::fs::FileType::Symlink {
            links += 1;
            if links > 40 {
                return Err(err(Errno::LOOP));
            }
            let target = rustix::fs::readlinkat(&next, "", Vec::new()).map_err(&err)?;
            let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
            if target.is_absolute() {
                cur = rustix::fs::open(
                    "/",
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(&err)?;
            }
            push_all(&mut todo, &target);
        } else if kind == rustix::fs::FileType::Directory {
            cur = next;
        } else {
            return Err(err(Errno::NOTDIR));
        }
    }
    // A real descriptor (not O_PATH), for fsync and for reading entries.
    let fd = rustix::fs::openat(
        &cur,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(&err)?;
    Ok((fd, trusted))
}

/// What was read: the text and the identity it was read under.
struct Read {
    text: String,
    stat: rustix::fs::Stat,
}

fn same_file(a: &rustix::fs::Stat, b: &rustix::fs::Stat) -> bool {
    (a.st_dev, a.st_ino, a.st_size, a.st_mtime, a.st_mtime_nsec)
        == (b.st_dev, b.st_ino, b.st_size, b.st_mtime, b.st_mtime_nsec)
}

/// Opens `name` in `dir` (never through a link), checks it, and reads it whole.
fn read_in(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    path: &Path,
    owner: Option<u32>,
) -> Result<Read, RewriteError> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Err(Errno::LOOP) => return Err(RewriteError::Symlink(path.to_owned())),
        r => r.map_err(errno(path))?,
    };
    let stat = rustix::fs::fstat(&fd).map_err(errno(path))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(RewriteError::NotRegular(path.to_owned()));
    }
    if let Some(expected) = owner
        && stat.st_uid != expected
    {
        return Err(RewriteError::ForeignOwner {
            path: path.to_owned(),
            owner: stat.st_uid,
            expected,
        });
    }
    let size = stat.st_size as u64;
    if size > MAX_BYTES {
        return Err(RewriteError::TooBig {
            path: path.to_owned(),
            size,
        });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::from(fd), MAX_BYTES + 1),
        &mut bytes,
    )
    .map_err(io_err(path))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(RewriteError::TooBig {
            path: path.to_owned(),
            size: bytes.len() as u64,
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| RewriteError::NotUtf8 {
        path: path.to_owned(),
        at: e.utf8_error().valid_up_to(),
    })?;
    Ok(Read { text, stat })
}

/// Opens the directory and reads the file, as `owner` would (see the module comment); runs `then` on
/// the same thread with the directory, the file's name and what was read.
fn with_file<T: Send>(
    path: &Path,
    owner: Owner,
    then: impl FnOnce(&OwnedFd, &std::ffi::OsStr, Read) -> Result<T, RewriteError> + Send,
) -> Result<T, RewriteError> {
    let (dir, name) = split(path)?;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    match owner {
        Owner::Uid(uid) => as_user(uid, NO_GROUP, || {
            let dfd = rustix::fs::open(
                dir,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(errno(dir))?;
            let read = read_in(&dfd, name, path, Some(uid))?;
            set_fs_ids(uid, read.stat.st_gid)?;
            then(&dfd, name, read)
        }),
        Owner::Within { uid, pid } => as_user(uid, NO_GROUP, || {
            let root = format!("/proc/{pid}/root");
            let rfd = rustix::fs::open(
                root.as_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(errno(Path::new(&root)))?;
            let inside = dir.strip_prefix("/").unwrap_or(dir);
            let inside = if inside.as_os_str().is_empty() {
                Path::new(".")
            } else {
                inside
            };
            let dfd = match rustix::fs::openat2(
                &rfd,
                inside,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                rustix::fs::ResolveFlags::IN_ROOT | rustix::fs::ResolveFlags::NO_MAGICLINKS,
            ) {
                // No openat2 (a kernel before 5.6, or a seccomp filter that does not know it, as
                // systemd's answers ENOSYS): the same walk by hand.
                Err(Errno::NOSYS | Errno::PERM) => super::root::walk_in_root(&rfd, inside),
                r => r,
            }
            .map_err(errno(dir))?;
            let read = read_in(&dfd, name, path, Some(uid))?;
            set_fs_ids(uid, read.stat.st_gid)?;
            then(&dfd, name, read)
        }),
        Owner::FileOwner => {
            let (dfd, trusted) = open_dir_tracking_trust(dir)?;
            let read = read_in(&dfd, name, path, None)?;
            let (uid, gid) = (read.stat.st_uid, read.stat.st_gid);
            if uid == 0 && !trusted {
                return Err(RewriteError::Untrusted {
                    path: path.to_owned(),
                    message: "a root-owned file reached through a directory or link another user owns; refusing (give a path through root's directories only)".into(),
                });
            }
            as_user(uid, gid, || {
                // Read again with the owner's rights: what memwatch writes is what the owner can read.
                let read = read_in(&dfd, name, path, Some(uid))?;
                then(&dfd, name, read)
            })
        }
    }
}

/// Reads `paths` from the file (for the knobs memwatch shows and changes).
pub fn read_values(
    path: &Path,
    format: Format,
    owner: Owner,
    paths: &[&str],
) -> Result<Vec<Option<Scalar>>, RewriteError> {
    let content = |error| RewriteError::Content {
        path: path.to_owned(),
        error,
    };
    with_file(path, owner, |_, _, read| {
        let doc = parse(format, &read.text).map_err(content)?;
        paths.iter().map(|p| doc.get(p).map_err(content)).collect()
    })
}

fn sibling(name: &std::ffi::OsStr, suffix: &str) -> OsString {
    let mut s = name.to_owned();
    s.push(suffix);
    s
}

const TMP: &str = ".memwatch-tmp-";
const ORIG: &str = ".memwatch-orig";

/// Removes temp files of this config that a writer which is gone (killed mid-write) left behind.
fn clean_stale_temps(dir: &OwnedFd, name: &std::ffi::OsStr) {
    let mut prefix = b".".to_vec();
    prefix.extend_from_slice(name.as_bytes());
    prefix.extend_from_slice(TMP.as_bytes());
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_bytes();
        let Some(rest) = file.strip_prefix(prefix.as_slice()) else {
            continue;
        };
        // `<pid>-<n>`: a live writer's file is its own business.
        let pid = std::str::from_utf8(rest)
            .ok()
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<i32>().ok());
        let alive = pid.is_some_and(|p| {
            p == std::process::id() as i32
                || nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None)
                    != Err(nix::errno::Errno::ESRCH)
        });
        if !alive {
            let _ = rustix::fs::unlinkat(dir, entry.file_name(), AtFlags::empty());
        }
    }
}

/// Writes `bytes` to a fresh temp file beside the config, with `mode`, fsynced; returns its name.
fn write_temp(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    bytes: &[u8],
    mode: u32,
) -> Result<OsString, Errno> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!("{TMP}{}-{n}", std::process::id()));
    let fd = rustix::fs::openat(
        dir,
        tmp.as_os_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?;
    let result = (|| {
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = rustix::io::write(&fd, rest)?;
            rest = &rest[n..];
        }
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
        rustix::fs::fsync(&fd)
    })();
    if let Err(e) = result {
        let _ = rustix::fs::unlinkat(dir, tmp.as_os_str(), AtFlags::empty());
        return Err(e);
    }
    Ok(tmp)
}

/// Keeps the original once: written whole to a temp file, then renamed without replacing.
fn keep_original(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    text: &str,
    mode: u32,
) -> Result<(), Errno> {
    let backup = sibling(name, ORIG);
    match rustix::fs::statat(dir, backup.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => return Ok(()),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(e),
    }
    let tmp = write_temp(dir, name, text.as_bytes(), mode)?;
    let placed = match rustix::fs::renameat_with(
        dir,
        tmp.as_os_str(),
        dir,
        backup.as_os_str(),
        RenameFlags::NOREPLACE,
    ) {
        // Filesystems without renameat2: a hard link also never replaces.
        Err(Errno::INVAL) | Err(Errno::NOSYS) => rustix::fs::linkat(
            dir,
            tmp.as_os_str(),
            dir,
            backup.as_os_str(),
            AtFlags::empty(),
        ),
        r => r,
    };
    let _ = rustix::fs::unlinkat(dir, tmp.as_os_str(), AtFlags::empty());
    match placed {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Each edited path with the value it held before the edit.
type Before = Vec<(String, Option<Scalar>)>;

/// Tries to apply the edits once. `Ok(None)`: the file changed under memwatch; read it again.
fn try_rewrite(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    path: &Path,
    format: Format,
    read: Read,
    edits: &[(String, Scalar)],
) -> Result<Option<Before>, RewriteError> {
    let content = |error| RewriteError::Content {
        path: path.to_owned(),
        error,
    };
    let doc = parse(format, &read.text).map_err(content)?;
    let new_text = apply_parsed(format, &read.text, &doc, edits).map_err(content)?;
    let before = edits
        .iter()
        .map(|(p, _)| Ok((p.clone(), doc.get(p)?)))
        .collect::<Result<Vec<_>, ContentError>>()
        .map_err(content)?;
    let mode = read.stat.st_mode & 0o7777;
    let err = errno(path);
    clean_stale_temps(dir, name);
    keep_original(dir, name, &read.text, mode).map_err(&err)?;
    let tmp = write_temp(dir, name, new_text.as_bytes(), mode).map_err(&err)?;
    #[cfg(test)]
    tests::before_rename(path);
    // Still the file that was read? An owner's save in the meantime must not be lost.
    let unchanged = match read_in(dir, name, path, Some(read.stat.st_uid)) {
        Ok(now) => same_file(&now.stat, &read.stat) && now.text == read.text,
        Err(_) => false,
    };
    if !unchanged {
        let _ = rustix::fs::unlinkat(dir, tmp.as_os_str(), AtFlags::empty());
        return Ok(None);
    }
    if let Err(e) = rustix::fs::renameat(dir, tmp.as_os_str(), dir, name) {
        let _ = rustix::fs::unlinkat(dir, tmp.as_os_str(), AtFlags::empty());
        return Err(err(e));
    }
    rustix::fs::fsync(dir).map_err(&err)?;
    Ok(Some(before))
}

/// Applies `edits` to the file at `path` for `owner`, safely (see the module comment).
pub fn rewrite(
    path: &Path,
    format: Format,
    owner: Owner,
    edits: &[(String, Scalar)],
) -> Result<Outcome, RewriteError> {
    let (_, name) = split(path)?;
    let backup = path.with_file_name(sibling(name, ORIG));
    for retries in 0..TRIES {
        let done = with_file(path, owner, |dir, name, read| {
            try_rewrite(dir, name, path, format, read, edits)
        })?;
        if let Some(before) = done {
            return Ok(Outcome {
                before,
                backup,
                retries,
            });
        }
    }
    Err(RewriteError::KeepsChanging(path.to_owned()))
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
