//! Emergency swap: a zram device, or a swapfile on a local disk, made for one paused job and removed
//! once RAM can take its pages back. Each device is recorded (a file under the state directory, fsync'd)
//! before it is sized or enabled, so a daemon killed at any instant leaves a record that the next one
//! clears. Blocking (mkswap, swapon, swapoff): runs on the blocking pool, never on the owner task.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the records are, under the state directory.
pub const RECORDS: &str = "emergency-swap";
/// The label written into every emergency swap header.
const LABEL: &str = "memwatch";
/// Emergency swap goes before any other swap the machine has.
const PRIORITY: &str = "32767";

pub use crate::job::held::{Device, Record};

pub use memwatch_core::way_out::{SwapError, SwapPlan as Plan};

fn io(path: &Path) -> impl Fn(std::io::Error) -> SwapError + '_ {
    move |source| SwapError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Makes and enables `bytes` of emergency swap for `job`: zram where the kernel has it, else a
/// swapfile. Whatever fails half-way is undone; the error says what and where.
pub fn make(plan: &Plan, job: &str, bytes: u64) -> Result<Record, SwapError> {
    let control = plan.root.join("sys/class/zram-control");
    if plan.zram && control.is_dir() {
        return make_zram(plan, job, bytes, &control);
    }
    match &plan.swapfile_dir {
        Some(dir) => make_file(plan, job, bytes, dir),
        None if plan.zram => Err(SwapError::NoZram(control)),
        None => Err(SwapError::Nowhere),
    }
}

fn make_zram(plan: &Plan, job: &str, bytes: u64, control: &Path) -> Result<Record, SwapError> {
    let hot_add = control.join("hot_add");
    let text = std::fs::read_to_string(&hot_add).map_err(io(&hot_add))?;
    let n: u32 = text.trim().parse().map_err(|_| SwapError::NotADevice {
        path: hot_add.clone(),
        text: text.trim().to_owned(),
    })?;
    let record = Record {
        device: Device::Zram(n),
        job: job.to_owned(),
        bytes,
    };
    let undo = |why: SwapError| {
        let _ = remove(plan, &record);
        why
    };
    write_record(&plan.state_dir, &record).map_err(undo)?;
    let disksize = plan.root.join(format!("sys/block/zram{n}/disksize"));
    std::fs::write(&disksize, bytes.to_string()).map_err(|e| undo(io(&disksize)(e)))?;
    enable(&record.device.path(&plan.root)).map_err(undo)?;
    Ok(record)
}

/// Filesystems a swapfile must never go on: memory-backed, layered or remote.
const NOT_LOCAL: &[(i64, &str)] = &[
    (0x0102_1994, "tmpfs"),
    (0x8584_58f6, "ramfs"),
    (0x794c_7630, "overlayfs"),
    (0x6969, "nfs"),
    (0x6573_5546, "fuse"),
    (0xff53_4d42, "cifs"),
    (0x5346_414f, "afs"),
];

/// Why `dir` cannot hold a swapfile of `bytes`, if it cannot.
pub fn unfit_for_swapfile(dir: &Path, bytes: u64) -> Option<SwapError> {
    let st = match rustix::fs::statfs(dir) {
        Ok(st) => st,
        Err(errno) => {
            return Some(SwapError::Statfs {
                dir: dir.to_owned(),
                errno: super::cgroup_error::errno(errno),
            });
        }
    };
    #[allow(clippy::unnecessary_cast)]
    let kind = st.f_type as i64;
    if let Some((_, name)) = NOT_LOCAL.iter().find(|(m, _)| *m == kind) {
        return Some(SwapError::NotLocal {
            dir: dir.to_owned(),
            fs: name,
        });
    }
    #[allow(clippy::unnecessary_cast)]
    let free = (st.f_bavail as u64).saturating_mul(st.f_bsize as u64);
    // Leave the disk at least 1 GiB besides the swapfile.
    if free < bytes.saturating_add(1 << 30) {
        return Some(SwapError::TooLittleDisk {
            dir: dir.to_owned(),
            free_mib: free >> 20,
            want_mib: bytes >> 20,
        });
    }
    None
}

fn make_file(plan: &Plan, job: &str, bytes: u64, dir: &Path) -> Result<Record, SwapError> {
    if let Some(why) = unfit_for_swapfile(dir, bytes) {
        return Err(why);
    }
    let path = dir.join(format!("memwatch-swap-{}", sanitize(job)));
    let record = Record {
        device: Device::File(path.clone()),
        job: job.to_owned(),
        bytes,
    };
    write_record(&plan.state_dir, &record)?;
    let undo = |why: SwapError| {
        let _ = remove(plan, &record);
        why
    };
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc_o_nofollow())
            .open(&path)
            .map_err(|e| undo(io(&path)(e)))?
    };
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes).map_err(
        |errno| {
            undo(SwapError::Allocate {
                path: path.clone(),
                bytes,
                errno: super::cgroup_error::errno(errno),
            })
        },
    )?;
    file.sync_all().map_err(|e| undo(io(&path)(e)))?;
    drop(file);
    enable(&path).map_err(undo)?;
    Ok(record)
}

fn libc_o_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

fn sanitize(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Writes a swap header and enables the device, ahead of all other swap.
fn enable(path: &Path) -> Result<(), SwapError> {
    run(tool("mkswap"), &["-L", LABEL, &path.to_string_lossy()])?;
    run(tool("swapon"), &["-p", PRIORITY, &path.to_string_lossy()])
}

/// An administration tool by absolute path (a service's PATH may lack the sbin directories).
fn tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn run(program: PathBuf, args: &[&str]) -> Result<(), SwapError> {
    let out = match Command::new(&program).args(args).output() {
        Ok(out) => out,
        Err(source) => return Err(SwapError::Spawn { program, source }),
    };
    if out.status.success() {
        return Ok(());
    }
    Err(SwapError::Failed {
        program,
        args: args.join(" "),
        status: out.status,
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

/// Bytes in use on `device`, from /proc/swaps; `None` when it is not enabled.
pub fn used_bytes(root: &Path, device: &Device) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/swaps")).ok()?;
    let want = device.to_string();
    parse_used(&text, &want)
}

fn parse_used(text: &str, device: &str) -> Option<u64> {
    text.lines().skip(1).find_map(|l| {
        let mut f = l.split_whitespace();
        let name = f.next()?;
        let used_kib: u64 = f.nth(2)?.parse().ok()?;
        (name == device).then_some(used_kib.saturating_mul(1024))
    })
}

/// Disables and removes a device and its record. Safe to repeat: what is already gone is skipped.
/// The caller checks first that RAM can take back what is swapped (swapoff would otherwise fail, or
/// push the machine into the very shortage memwatch is avoiding).
pub fn remove(plan: &Plan, record: &Record) -> Result<(), SwapError> {
    let path = record.device.path(&plan.root);
    if used_bytes(&plan.root, &record.device).is_some() {
        run(tool("swapoff"), &[&path.to_string_lossy()])?;
    }
    match &record.device {
        Device::Zram(n) => {
            let block = plan.root.join(format!("sys/block/zram{n}"));
            if block.exists() {
                let hot_remove = plan.root.join("sys/class/zram-control/hot_remove");
                std::fs::write(&hot_remove, n.to_string()).map_err(io(&hot_remove))?;
            }
        }
        Device::File(p) => match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(p)(e)),
        },
    }
    let r = plan
        .state_dir
        .join(RECORDS)
        .join(record.device.record_name());
    match std::fs::remove_file(&r) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&r)(e)),
    }
}

fn write_record(state_dir: &Path, record: &Record) -> Result<(), SwapError> {
    let dir = state_dir.join(RECORDS);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let path = dir.join(record.device.record_name());
    let text = serde_json::to_vec(record)?;
    std::fs::File::create(&path)
        .and_then(|mut f| {
            f.write_all(&text)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::File::open(&dir)?.sync_all())
        .map_err(io(&path))
}

/// Every device a daemon recorded and did not remove (its own, or a killed predecessor's).
pub fn recorded(state_dir: &Path) -> Vec<Record> {
    let Ok(entries) = std::fs::read_dir(state_dir.join(RECORDS)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_swaps_is_read_by_device() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                    /dev/zram3                              partition\t1048572\t\t2048\t\t32767\n\
                    /swapfile                               file\t\t4194300\t\t0\t\t-2\n";
        assert_eq!(parse_used(text, "/dev/zram3"), Some(2048 * 1024));
        assert_eq!(parse_used(text, "/swapfile"), Some(0));
        assert_eq!(parse_used(text, "/dev/zram1"), None);
        assert_eq!(
            parse_used("Filename Type\n/dev/zram3 partition x y", "/dev/zram3"),
            None
        );
    }

    #[test]
    fn a_swapfile_never_goes_on_tmpfs_and_records_survive() {
        // /dev/shm is tmpfs on every Linux this runs on.
        let why = unfit_for_swapfile(Path::new("/dev/shm"), 1 << 20).unwrap();
        assert!(
            matches!(why, SwapError::NotLocal { fs: "tmpfs", .. }),
            "{why}"
        );
        assert!(why.to_string().contains("tmpfs"), "{why}");
        let plan = Plan {
            root: PathBuf::from("/nonexistent-root"),
            state_dir: tempfile::tempdir().unwrap().keep(),
            zram: true,
            swapfile_dir: None,
        };
        let e = make(&plan, "j", 1 << 20).unwrap_err();
        assert!(matches!(e, SwapError::NoZram(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("no zram") && e.contains("swapfile_dir"), "{e}");
        let r = Record {
            device: Device::Zram(7),
            job: "j".into(),
            bytes: 1,
        };
        write_record(&plan.state_dir, &r).unwrap();
        assert_eq!(recorded(&plan.state_dir), vec![r.clone()]);
        // Nothing of it exists under this root: removing it only drops the record.
        remove(&plan, &r).unwrap();
        assert!(recorded(&plan.state_dir).is_empty());
    }
}
