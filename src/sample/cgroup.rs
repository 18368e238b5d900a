//! The memory cgroup that bounds the daemon's own view of the host (cgroup v1 and v2).
//!
//! On a machine where memwatch runs inside a container or a systemd slice, the limit that matters may be
//! the cgroup's, not MemTotal. The reader finds the process's memory cgroup from `/proc/self/cgroup`,
//! then the tightest limit on the path from that cgroup up to the hierarchy's root.

use std::path::{Path, PathBuf};

use super::error::{ReadError, parse_u64, read_text};
use super::keyed::{key_value, key_values, read_u64};

pub use memwatch_core::sample::cgroup::{
    CgroupDir, CgroupMemory, LimitSource, Membership, PageCache, UnknownVersion, Version,
    cache_keys, parse_membership,
};

/// v1 reports "no limit" as PAGE_COUNTER_MAX rounded to pages; anything this large is no limit.
const V1_UNLIMITED: u64 = 1 << 60;

/// Reads the memory cgroup of the process that `<root>/proc/self` names. `Ok(None)` when there is none
/// (no memory controller mounted).
pub fn read_self(root: &Path) -> Result<Option<CgroupMemory>, ReadError> {
    let path = root.join("proc/self/cgroup");
    let membership = parse_membership(&path, &read_text(&path)?)?;
    read_membership(root, &membership)
}

/// Reads the memory cgroup described by `membership` under `root`.
pub fn read_membership(
    root: &Path,
    membership: &Membership,
) -> Result<Option<CgroupMemory>, ReadError> {
    match locate(root, membership) {
        Some(d) => read_dir(&d).map(Some),
        None => Ok(None),
    }
}

/// Finds the memory cgroup's directory: the v1 memory controller if mounted, else cgroup v2.
pub fn locate(root: &Path, membership: &Membership) -> Option<CgroupDir> {
    let cgroup_fs = root.join("sys/fs/cgroup");
    if let Some(cg) = &membership.v1_memory {
        let mount = cgroup_fs.join("memory");
        if mount.is_dir() {
            return Some(CgroupDir {
                version: Version::V1,
                path: cg.clone(),
                dir: dir_of(&mount, cg),
                mount,
            });
        }
    }
    if let Some(cg) = &membership.v2 {
        if cgroup_fs.join("cgroup.controllers").is_file() {
            return Some(CgroupDir {
                version: Version::V2,
                path: cg.clone(),
                dir: dir_of(&cgroup_fs, cg),
                mount: cgroup_fs,
            });
        }
    }
    None
}

/// The file that holds a cgroup's current usage, by version.
pub fn usage_file(version: Version) -> &'static str {
    match version {
        Version::V1 => "memory.usage_in_bytes",
        Version::V2 => "memory.current",
    }
}

/// Reads only the cgroup's current usage: the cheap read probes make between full reads.
pub fn read_usage(d: &CgroupDir) -> Result<u64, ReadError> {
    read_u64(&d.dir.join(usage_file(d.version)))
}

/// Reads the processes the kernel's OOM killer killed in the cgroup (`oom_kill` of memory.events, or
/// of memory.oom_control on v1); `None` when it cannot be read.
pub fn read_oom_kills(d: &CgroupDir) -> Option<u64> {
    let file = if d.version == Version::V1 {
        "memory.oom_control"
    } else {
        "memory.events"
    };
    key_value(&d.dir.join(file), "oom_kill").ok().flatten()
}

/// Reads only the cgroup's page cache (memory.stat, which the kernel sums before it prints it: about
/// 50 µs); `None` when it cannot be read.
pub fn read_cache(d: &CgroupDir) -> Option<PageCache> {
    let path = d.dir.join("memory.stat");
    let text = read_text(&path).ok()?;
    let values = super::keyed::stat_values(&path, &text, cache_keys(d.version));
    Some(PageCache::from_stat(values))
}

/// Reads usage, the tightest limit up to the root, OOM kills and page cache.
pub fn read_dir(d: &CgroupDir) -> Result<CgroupMemory, ReadError> {
    if d.version == Version::V1 {
        read_v1(&d.mount, &d.dir, &d.path)
    } else {
        read_v2(&d.mount, &d.dir, &d.path)
    }
}

/// The directory of `cg` under `mount`. Inside a cgroup namespace the path in /proc/self/cgroup may
/// not exist under the mount; the mount itself is then the process's cgroup.
/// Whether `d.dir` is the cgroup its path names, rather than the hierarchy's root stood in for a
/// path not found under the mount (as the daemon's own cgroup in a cgroup namespace is: there the
/// namespace's root is its cgroup), or a path that climbs out of it.
pub fn names_its_dir(d: &CgroupDir) -> bool {
    let rel = d.path.trim_matches('/');
    !rel.split('/').any(|c| c == "..") && (rel.is_empty() || d.dir != d.mount)
}

fn dir_of(mount: &Path, cg: &str) -> PathBuf {
    let dir = mount.join(cg.trim_start_matches('/'));
    if dir.is_dir() { dir } else { mount.to_owned() }
}

/// The directories from `dir` up to `mount`, innermost first.
fn ancestors<'a>(mount: &'a Path, dir: &'a Path) -> impl Iterator<Item = &'a Path> {
    dir.ancestors().take_while(move |d| d.starts_with(mount))
}

fn read_v1(mount: &Path, dir: &Path, cg: &str) -> Result<CgroupMemory, ReadError> {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let mut limit = Tightest::default();
    for d in ancestors(mount, dir) {
        if let Ok(l) = read_u64(&d.join("memory.limit_in_bytes")) {
            if l < V1_UNLIMITED {
                limit.offer(l, "memory.limit_in_bytes", mount, d);
            }
        }
    }
    let oom_kills = v1_oom_kills(dir, V1_OOM_DEPTH);
    let stat = memory_stat(dir, Version::V1, ["total_rss", "total_cache"]);
    Ok(CgroupMemory {
        version: Version::V1,
        path: cg.to_owned(),
        usage_bytes: usage,
        limit_bytes: limit.bytes,
        limit_source: limit.source,
        oom_kills,
        inactive_file_bytes: stat.cache.map(|c| c.inactive),
        active_file_bytes: stat.cache.map(|c| c.active),
        dirty_bytes: stat.cache.map(|c| c.dirty),
        anon_bytes: stat.anon,
        file_bytes: stat.file,
    })
}

/// What memory.stat says of a cgroup's memory: its page cache, anonymous and file pages.
struct Stat {
    cache: Option<PageCache>,
    anon: Option<u64>,
    file: Option<u64>,
}

/// memory.stat's page cache (`cache_keys`) and the anonymous and file pages by `anon_file`'s keys.
fn memory_stat(dir: &Path, version: Version, anon_file: [&str; 2]) -> Stat {
    let [inactive, active, dirty, writeback] = cache_keys(version);
    let [i, a, d, w, anon, file] = key_values(
        &dir.join("memory.stat"),
        [
            inactive,
            active,
            dirty,
            writeback,
            anon_file[0],
            anon_file[1],
        ],
    );
    Stat {
        // Without its inactive count (an unreadable memory.stat) nothing is known of the cache.
        cache: i.map(|_| PageCache::from_stat([i, a, d, w])),
        anon,
        file,
    }
}

/// How deep below a job's v1 cgroup OOM kills are counted: a Slurm job's `step_N/task_M` and one more.
const V1_OOM_DEPTH: usize = 3;

/// OOM kills in a v1 memory cgroup and its descendants down to `depth` levels. v1's
/// `memory.oom_control` counts only kills in its own cgroup (v2's memory.events is hierarchical), and
/// a Slurm job's tasks run in step and task cgroups below the job's, where a kill would otherwise go
/// unseen. `None` when the job's own file has no count.
fn v1_oom_kills(dir: &Path, depth: usize) -> Option<u64> {
    let own = key_value(&dir.join("memory.oom_control"), "oom_kill")
        .ok()
        .flatten()?;
    let below: u64 = if depth == 0 {
        0
    } else {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| v1_oom_kills(&e.path(), depth - 1))
            .fold(0, u64::saturating_add)
    };
    Some(own.saturating_add(below))
}

fn read_v2(mount: &Path, dir: &Path, cg: &str) -> Result<CgroupMemory, ReadError> {
    let usage = read_u64(&dir.join("memory.current"))?;
    let mut limit = Tightest::default();
    for d in ancestors(mount, dir) {
        // memory.max first: at equal values the hard limit is the one named.
        for name in ["memory.max", "memory.high"] {
            let file = d.join(name);
            let Ok(text) = read_text(&file) else {
                continue;
            };
            if text.trim() != "max" {
                limit.offer(parse_u64(&file, name, &text)?, name, mount, d);
            }
        }
    }
    let oom_kills = key_value(&dir.join("memory.events"), "oom_kill")
        .ok()
        .flatten();
    let stat = memory_stat(dir, Version::V2, ["anon", "file"]);
    Ok(CgroupMemory {
        version: Version::V2,
        path: cg.to_owned(),
        usage_bytes: usage,
        limit_bytes: limit.bytes,
        limit_source: limit.source,
        oom_kills,
        inactive_file_bytes: stat.cache.map(|c| c.inactive),
        active_file_bytes: stat.cache.map(|c| c.active),
        dirty_bytes: stat.cache.map(|c| c.dirty),
        anon_bytes: stat.anon,
        file_bytes: stat.file,
    })
}

/// The lowest limit offered so far and where it was read.
#[derive(Default)]
struct Tightest {
    bytes: Option<u64>,
    source: Option<LimitSource>,
}

impl Tightest {
    /// Keeps `bytes` (read from `file` in the cgroup directory `dir` under `mount`) if it is lower
    /// than what is kept; a tie keeps the first offered.
    fn offer(&mut self, bytes: u64, file: &str, mount: &Path, dir: &Path) {
        if self.bytes.is_some_and(|cur| cur <= bytes) {
            return;
        }
        let rel = dir.strip_prefix(mount).unwrap_or(dir);
        self.bytes = Some(bytes);
        self.source = Some(LimitSource {
            file: file.to_owned(),
            path: format!("/{}", rel.display()),
        });
    }
}

/// Collects the pids in the cgroup at `dir` and in every cgroup below it into `out`; `false` when a
/// directory could not be read (the list is then short).
pub fn pids_below(dir: &Path, out: &mut Vec<u32>) -> bool {
    let Ok(text) = read_text(&dir.join("cgroup.procs")) else {
        return false;
    };
    out.extend(
        text.split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok()),
    );
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    // cgroupfs gives each entry's type with the listing: no stat per control file.
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .all(|e| pids_below(&e.path(), out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A job's path found under the mount is its cgroup; one not found there, or one that climbs
    /// out of the daemon's cgroup namespace, is not the root's.
    #[test]
    fn a_path_not_under_the_mount_is_not_the_roots_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("sys/fs/cgroup");
        std::fs::create_dir_all(mount.join("system.slice/job.service")).unwrap();
        std::fs::write(mount.join("cgroup.controllers"), "memory\n").unwrap();
        let at = |path: &str| {
            locate(
                dir.path(),
                &Membership {
                    v1_memory: None,
                    v1_freezer: None,
                    v2: Some(path.into()),
                },
            )
            .unwrap()
        };
        assert!(names_its_dir(&at("/system.slice/job.service")));
        assert!(names_its_dir(&at("/")));
        let missing = at("/kubepods.slice/pod1/cri-1.scope");
        assert_eq!(
            missing.dir, mount,
            "located at the root, as the daemon's own cgroup is"
        );
        assert!(!names_its_dir(&missing));
        assert!(!names_its_dir(&at("/../../kubepods.slice")));
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    #[test]
    fn v2_takes_tightest_ancestor_limit() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "proc/self/cgroup", "0::/a/b\n");
        write(r, "sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
        write(r, "sys/fs/cgroup/a/memory.max", "1000\n");
        write(r, "sys/fs/cgroup/a/b/memory.max", "max\n");
        write(r, "sys/fs/cgroup/a/b/memory.current", "600\n");
        write(
            r,
            "sys/fs/cgroup/a/b/memory.events",
            "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n",
        );
        write(
            r,
            "sys/fs/cgroup/a/b/memory.stat",
            "anon 400\nfile 150\nkernel 50\ninactive_file 100\n",
        );
        let cg = read_self(r).unwrap().unwrap();
        assert_eq!(
            (cg.version, cg.usage_bytes, cg.limit_bytes, cg.oom_kills),
            (Version::V2, 600, Some(1000), Some(1))
        );
        assert_eq!(
            cg.limit_source.clone().map(|s| (s.file, s.path)),
            Some(("memory.max".into(), "/a".into()))
        );
        assert_eq!(
            (cg.working_set_bytes(), cg.charged_bytes()),
            (500, Some(550))
        );
    }

    /// A job under `MemoryHigh=` alone (memory.max "max"): the kernel throttles and reclaims at
    /// memory.high, so that is its limit; where an ancestor's memory.max is lower, that wins, and
    /// each time the source names the file and the cgroup.
    #[test]
    fn v2_memory_high_is_a_limit_and_the_source_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "proc/self/cgroup", "0::/work.slice/job.service\n");
        write(r, "sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
        write(r, "sys/fs/cgroup/work.slice/memory.max", "max\n");
        write(r, "sys/fs/cgroup/work.slice/memory.high", "max\n");
        let job = "sys/fs/cgroup/work.slice/job.service";
        write(r, &format!("{job}/memory.max"), "max\n");
        write(r, &format!("{job}/memory.high"), "268435456\n");
        write(r, &format!("{job}/memory.current"), "200000000\n");
        let cg = read_self(r).unwrap().unwrap();
        assert_eq!(cg.limit_bytes, Some(268435456));
        assert_eq!(
            cg.limit_source,
            Some(LimitSource {
                file: "memory.high".into(),
                path: "/work.slice/job.service".into()
            })
        );
        // The slice's hard limit is tighter: it is the limit now.
        write(r, "sys/fs/cgroup/work.slice/memory.max", "200000000\n");
        let cg = read_self(r).unwrap().unwrap();
        assert_eq!(cg.limit_bytes, Some(200000000));
        assert_eq!(
            cg.limit_source.map(|s| (s.file, s.path)),
            Some(("memory.max".into(), "/work.slice".into()))
        );
        // The same number in both of the job's files: the hard limit is named.
        write(r, &format!("{job}/memory.max"), "150000000\n");
        write(r, &format!("{job}/memory.high"), "150000000\n");
        let cg = read_self(r).unwrap().unwrap();
        assert_eq!(
            cg.limit_source.map(|s| (s.file, s.path)),
            Some(("memory.max".into(), "/work.slice/job.service".into()))
        );
        // Garbage in memory.high is an error that names the file.
        write(r, &format!("{job}/memory.high"), "lots\n");
        let e = read_self(r).unwrap_err().to_string();
        assert!(e.contains("memory.high"), "{e}");
    }

    #[test]
    fn v1_unlimited_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "proc/self/cgroup", "4:memory:/job\n0::/\n");
        write(
            r,
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/job/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/job/memory.usage_in_bytes",
            "4096\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/job/memory.stat",
            "cache 1\nrss 2\ntotal_cache 1024\ntotal_rss 2048\ntotal_inactive_file 512\n",
        );
        let cg = read_self(r).unwrap().unwrap();
        assert_eq!(
            (cg.version, cg.usage_bytes, cg.limit_bytes),
            (Version::V1, 4096, None)
        );
        assert_eq!(
            (cg.anon_bytes, cg.file_bytes, cg.inactive_file_bytes),
            (Some(2048), Some(1024), Some(512))
        );
    }

    /// v1 counts a kill only in its own cgroup: a kill in a Slurm job's step or task cgroup is
    /// counted for the job too (what slurmstepd reports as "Detected 1 oom-kill event(s) in StepId").
    #[test]
    fn v1_counts_the_oom_kills_of_step_and_task_cgroups() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let job = "sys/fs/cgroup/memory/slurm_n1/uid_0/job_7";
        write(
            r,
            "proc/self/cgroup",
            "4:memory:/slurm_n1/uid_0/job_7\n0::/\n",
        );
        write(r, &format!("{job}/memory.usage_in_bytes"), "4096\n");
        write(r, &format!("{job}/memory.limit_in_bytes"), "1048576\n");
        let oom = |n: u32| format!("oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n");
        write(r, &format!("{job}/memory.oom_control"), &oom(0));
        assert_eq!(read_self(r).unwrap().unwrap().oom_kills, Some(0));
        write(r, &format!("{job}/step_0/memory.oom_control"), &oom(1));
        write(
            r,
            &format!("{job}/step_0/task_0/memory.oom_control"),
            &oom(2),
        );
        write(r, &format!("{job}/step_batch/memory.oom_control"), &oom(0));
        assert_eq!(read_self(r).unwrap().unwrap().oom_kills, Some(3));
    }

    #[test]
    fn no_memory_controller_is_none() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "proc/self/cgroup", "0::/\n");
        assert_eq!(read_self(dir.path()).unwrap(), None);
    }
}
