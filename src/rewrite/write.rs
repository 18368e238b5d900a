//! Writing a rewritten config safely.
//!
//! - Refuses symlinks, non-regular files, and files not owned by the job's user.
//! - Reads through `O_NOFOLLOW` and checks it read the file it inspected.
//! - Writes with the owner's filesystem rights (`setfsuid`/`setfsgid` on a thread of its own), so memwatch
//!   can write nothing the owner could not, and leaves no root-owned file in a user's directory.
//! - Keeps the original once as `<file>.memwatch-orig`, writes a temp file in the same directory with the
//!   original's mode, fsyncs it, renames it over the file and fsyncs the directory: a crash at any point
//!   leaves the old file or the new one, never a broken one.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{Format, Scalar, apply, leaves};

/// Why a rewrite was refused or failed. Nothing was written in any case.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("{0}: is a symbolic link; memwatch rewrites regular files only")]
    Symlink(PathBuf),
    #[error("{0}: not a regular file")]
    NotRegular(PathBuf),
    #[error(
        "{path}: owned by uid {owner}, not by the job's user (uid {expected}); refusing to rewrite it"
    )]
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        expected: u32,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Content { path: PathBuf, message: String },
}

/// What a rewrite changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Each edited path with its previous value.
    pub before: Vec<(String, Option<Scalar>)>,
    pub backup: PathBuf,
}

const MAX_BYTES: u64 = 16 << 20;

fn io(path: &Path) -> impl Fn(std::io::Error) -> RewriteError + '_ {
    move |source| RewriteError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads and checks the file as it is: regular, not a link, owned by `owner`.
pub fn read_checked(path: &Path, owner: u32) -> Result<(String, std::fs::Metadata), RewriteError> {
    let meta = std::fs::symlink_metadata(path).map_err(io(path))?;
    if meta.file_type().is_symlink() {
        return Err(RewriteError::Symlink(path.to_owned()));
    }
    if !meta.is_file() {
        return Err(RewriteError::NotRegular(path.to_owned()));
    }
    if meta.uid() != owner {
        return Err(RewriteError::ForeignOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            expected: owner,
        });
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(path))?;
    let opened = f.metadata().map_err(io(path))?;
    if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
        return Err(RewriteError::Content {
            path: path.to_owned(),
            message: "the file changed while it was read".into(),
        });
    }
    let mut text = String::new();
    Read::by_ref(&mut f)
        .take(MAX_BYTES)
        .read_to_string(&mut text)
        .map_err(io(path))?;
    Ok((text, meta))
}

/// Reads `paths` from the file (for the knobs memwatch shows and changes).
pub fn read_values(
    path: &Path,
    format: Format,
    owner: u32,
    paths: &[&str],
) -> Result<Vec<Option<Scalar>>, RewriteError> {
    let (text, _) = read_checked(path, owner)?;
    let all = leaves(format, &text).map_err(|message| RewriteError::Content {
        path: path.to_owned(),
        message,
    })?;
    Ok(paths.iter().map(|p| all.get(*p).cloned()).collect())
}

/// Runs `f` on a fresh thread whose filesystem uid and gid are the owner's.
fn as_owner<T: Send>(
    uid: u32,
    gid: u32,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(move || {
            use nix::unistd::{Gid, Uid, setfsgid, setfsuid};
            setfsgid(Gid::from_raw(gid));
            setfsuid(Uid::from_raw(uid));
            // setfsuid reports the previous value: asking again tells whether the change took.
            if setfsuid(Uid::from_raw(uid)).as_raw() != uid || setfsgid(Gid::from_raw(gid)).as_raw() != gid {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("cannot take the file owner's rights (uid {uid}); run the daemon as root or as that user"),
                ));
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the writer thread panicked")))
    })
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{name}{suffix}"))
}

/// Applies `edits` to the file at `path` owned by `owner`, safely (see the module comment).
pub fn rewrite(
    path: &Path,
    format: Format,
    owner: u32,
    edits: &[(String, Scalar)],
) -> Result<Outcome, RewriteError> {
    let (text, meta) = read_checked(path, owner)?;
    let old = leaves(format, &text).map_err(|message| RewriteError::Content {
        path: path.to_owned(),
        message,
    })?;
    let new_text = apply(format, &text, edits).map_err(|message| RewriteError::Content {
        path: path.to_owned(),
        message,
    })?;
    let before = edits
        .iter()
        .map(|(p, _)| (p.clone(), old.get(p).cloned()))
        .collect();
    let mode = meta.permissions().mode() & 0o7777;
    let dir = path
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."));
    let backup = sibling(path, ".memwatch-orig");
    let tmp = dir.join(format!(
        ".{}.memwatch-tmp-{}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let write = |target: &Path, bytes: &[u8], exclusive: bool| -> std::io::Result<()> {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).mode(mode).custom_flags(nix::libc::O_NOFOLLOW);
        if exclusive {
            o.create_new(true);
        } else {
            o.create(true).truncate(true);
        }
        let mut f = o.open(target)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()
    };
    as_owner(meta.uid(), meta.gid(), || {
        if !backup.exists() {
            write(&backup, text.as_bytes(), true)?;
        }
        let _ = std::fs::remove_file(&tmp);
        let result =
            write(&tmp, new_text.as_bytes(), true).and_then(|()| std::fs::rename(&tmp, path));
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        std::fs::File::open(&dir)?.sync_all()
    })
    .map_err(io(path))?;
    Ok(Outcome { before, backup })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_links_foreign_files_and_garbage_leaving_them_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("train.json");
        std::fs::write(&f, "{\"batch\": 8}").unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = rewrite(&link, Format::Json, me, &[("batch".into(), Scalar::Int(4))]).unwrap_err();
        assert!(matches!(e, RewriteError::Symlink(_)), "{e}");
        let e = rewrite(
            &f,
            Format::Json,
            me + 1,
            &[("batch".into(), Scalar::Int(4))],
        )
        .unwrap_err();
        assert!(e.to_string().contains("not by the job's user"), "{e}");
        std::fs::write(&f, "{\"batch\": 8,,}").unwrap();
        let e = rewrite(&f, Format::Json, me, &[("batch".into(), Scalar::Int(4))]).unwrap_err();
        assert!(e.to_string().contains("not valid JSON"), "{e}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "{\"batch\": 8,,}");
        assert!(!sibling(&f, ".memwatch-orig").exists());
    }

    #[test]
    fn keeps_mode_and_a_backup_of_the_original() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("train.toml");
        std::fs::write(&f, "batch = 8 # comment\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let out = rewrite(&f, Format::Toml, me, &[("batch".into(), Scalar::Int(4))]).unwrap();
        assert_eq!(out.before, vec![("batch".into(), Some(Scalar::Int(8)))]);
        rewrite(&f, Format::Toml, me, &[("batch".into(), Scalar::Int(2))]).unwrap();
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "batch = 2 # comment\n"
        );
        assert_eq!(
            std::fs::read_to_string(&out.backup).unwrap(),
            "batch = 8 # comment\n"
        );
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o640
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
