//! Tests of the safe writer (`write.rs`).

use super::*;
use std::os::unix::fs::PermissionsExt;

type Hook = Box<dyn Fn(&Path) + Send>;

/// What a test does between memwatch's read and its rename (an owner saving the file).
static BEFORE_RENAME: Mutex<Option<Hook>> = Mutex::new(None);

pub(super) fn before_rename(path: &Path) {
    if let Some(hook) = BEFORE_RENAME
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
    {
        hook(path);
    }
}

/// Runs `f` with `hook` in place; tests that set it hold ONE_AT_A_TIME's order through `rewrite`.
fn with_hook<T>(hook: Hook, f: impl FnOnce() -> T) -> T {
    *BEFORE_RENAME.lock().unwrap() = Some(hook);
    let out = f();
    *BEFORE_RENAME.lock().unwrap() = None;
    out
}

#[test]
fn an_owner_save_during_a_rewrite_is_never_lost() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("train.yaml");
    std::fs::write(&f, "lr: 0.001\nbatch: 8\n").unwrap();
    let me = nix::unistd::geteuid().as_raw();
    let edit = [("batch".to_owned(), Scalar::Int(4))];
    // The owner saves once, between memwatch's read and its rename: memwatch starts over from
    // the owner's text, and both changes are in the file.
    let saved = std::sync::atomic::AtomicBool::new(false);
    let saved = std::sync::Arc::new(saved);
    let once = saved.clone();
    let target = f.clone();
    let out = with_hook(
        Box::new(move |p| {
            // Other tests' rewrites pass here too: only this file's.
            if p == target && !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                std::fs::write(p, "lr: 0.0003\nbatch: 8\n").unwrap();
            }
        }),
        || rewrite(&f, Format::Yaml, Owner::Uid(me), &edit),
    )
    .unwrap();
    assert_eq!(out.retries, 1);
    assert_eq!(
        std::fs::read_to_string(&f).unwrap(),
        "lr: 0.0003\nbatch: 4\n"
    );
    // An owner who keeps saving: memwatch gives up after three tries and the owner's last save
    // stands.
    let n = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let count = n.clone();
    let target = f.clone();
    let e = with_hook(
        Box::new(move |p| {
            if p != target {
                return;
            }
            let i = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::fs::write(p, format!("lr: 0.{i}1\nbatch: 4\n")).unwrap();
        }),
        || {
            rewrite(
                &f,
                Format::Yaml,
                Owner::Uid(me),
                &[("batch".to_owned(), Scalar::Int(2))],
            )
        },
    )
    .unwrap_err();
    assert!(matches!(e, RewriteError::KeepsChanging(_)), "{e}");
    assert!(
        e.to_string()
            .contains("changed while memwatch was writing it"),
        "{e}"
    );
    let last = n.load(std::sync::atomic::Ordering::SeqCst) - 1;
    assert_eq!(
        std::fs::read_to_string(&f).unwrap(),
        format!("lr: 0.{last}1\nbatch: 4\n")
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn refuses_links_foreign_files_and_garbage_leaving_them_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("train.json");
    std::fs::write(&f, "{\"batch\": 8}").unwrap();
    let me = nix::unistd::geteuid().as_raw();
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&f, &link).unwrap();
    let e = rewrite(
        &link,
        Format::Json,
        Owner::Uid(me),
        &[("batch".into(), Scalar::Int(4))],
    )
    .unwrap_err();
    assert!(matches!(e, RewriteError::Symlink(_)), "{e}");
    let e = rewrite(
        &f,
        Format::Json,
        Owner::Uid(me + 1),
        &[("batch".into(), Scalar::Int(4))],
    )
    .unwrap_err();
    // Another user's rights cannot even read a private temp directory: refused either way.
    assert!(
        e.to_string().contains("not by the job's user") || e.to_string().contains("denied"),
        "{e}"
    );
    std::fs::write(&f, "{\"batch\": 8,,}").unwrap();
    let e = rewrite(
        &f,
        Format::Json,
        Owner::Uid(me),
        &[("batch".into(), Scalar::Int(4))],
    )
    .unwrap_err();
    assert!(
        matches!(
            &e,
            RewriteError::Content {
                error: ContentError::Syntax {
                    format: Format::Json,
                    ..
                },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("not valid JSON"), "{e}");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "{\"batch\": 8,,}");
    assert!(!dir.path().join("train.json.memwatch-orig").exists());
}

#[test]
fn keeps_mode_and_a_backup_of_the_original_and_cleans_stale_temps() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("train.toml");
    std::fs::write(&f, "batch = 8 # comment\n").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    // Left by a writer killed mid-write (no such pid).
    let stale = dir.path().join(".train.toml.memwatch-tmp-2147483647-0");
    std::fs::write(&stale, "batch = 1").unwrap();
    let me = nix::unistd::geteuid().as_raw();
    let out = rewrite(
        &f,
        Format::Toml,
        Owner::Uid(me),
        &[("batch".into(), Scalar::Int(4))],
    )
    .unwrap();
    assert_eq!(out.before, vec![("batch".into(), Some(Scalar::Int(8)))]);
    rewrite(
        &f,
        Format::Toml,
        Owner::FileOwner,
        &[("batch".into(), Scalar::Int(2))],
    )
    .unwrap();
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
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn refuses_files_over_the_bound_whole() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("big.yaml");
    let mut text = String::from("batch: 8\n");
    while (text.len() as u64) <= MAX_BYTES {
        text.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    text.push_str("last: 1\n");
    std::fs::write(&f, &text).unwrap();
    let me = nix::unistd::geteuid().as_raw();
    let e = rewrite(
        &f,
        Format::Yaml,
        Owner::Uid(me),
        &[("batch".into(), Scalar::Int(4))],
    )
    .unwrap_err();
    assert!(matches!(e, RewriteError::TooBig { .. }), "{e}");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), text);
    assert!(!dir.path().join("big.yaml.memwatch-orig").exists());
}
