//! A memory cgroup as data (its usage, its tightest limit and where that comes from, where its files
//! are) and the parser of /proc/PID/cgroup. memwatch's reader finds a process's memory cgroup from
//! that file, then the tightest limit on the path from that cgroup up to the hierarchy's root.

use std::path::{Path, PathBuf};

use crate::expo::{Writer, bytes as b};
use serde::{Deserialize, Serialize};

use super::error::ReadError;

pub use crate::host::{UnknownVersion, Version};

/// Usage and limit of a memory cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupMemory {
    /// Which hierarchy it is in.
    pub version: Version,
    /// The cgroup's path inside its hierarchy, e.g. `/system.slice/memwatch.service`.
    pub path: String,
    /// Memory charged to the cgroup now.
    pub usage_bytes: u64,
    /// The tightest limit on the path to the root; `None` when nothing limits it. On cgroup v2 the
    /// lower of `memory.high` (where the kernel throttles and reclaims, and systemd-oomd then finds
    /// the pressure it kills on) and `memory.max` (where the kernel OOM-kills), over every ancestor.
    pub limit_bytes: Option<u64>,
    /// Where `limit_bytes` comes from: the file and the cgroup that set it.
    #[serde(default)]
    pub limit_source: Option<LimitSource>,
    /// OOM kills inside the cgroup, where the kernel reports them.
    pub oom_kills: Option<u64>,
    /// Inactive page cache; usage less this is the working set (as kubelet counts it).
    pub inactive_file_bytes: Option<u64>,
    /// Active page cache: file pages read more than once, such as a dataset read each epoch, or
    /// mapped and used. The kernel drops it too before it OOM-kills, once it is clean.
    #[serde(default)]
    pub active_file_bytes: Option<u64>,
    /// Page cache that is dirty or under writeback (v1 `total_dirty` + `total_writeback`, v2
    /// `file_dirty` + `file_writeback`): it must be written out before the kernel can drop it.
    #[serde(default)]
    pub dirty_bytes: Option<u64>,
    /// Anonymous memory charged to the cgroup (v1 `total_rss`, v2 `anon`): the heap, tensors,
    /// copy-on-write copies.
    #[serde(default)]
    pub anon_bytes: Option<u64>,
    /// File pages charged to the cgroup (v1 `total_cache`, v2 `file`): page cache and shared memory
    /// that the cgroup's processes first touched. A library mapped by many processes is charged to
    /// one cgroup only, where PSS splits it among every process that maps it.
    #[serde(default)]
    pub file_bytes: Option<u64>,
}

/// A cgroup's page cache, as memory.stat gives it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageCache {
    /// Inactive file pages.
    pub inactive: u64,
    /// Active file pages.
    pub active: u64,
    /// File pages dirty or under writeback (on those two lists too).
    pub dirty: u64,
}

impl PageCache {
    /// From memory.stat's values for [`cache_keys`], in their order; `None` where a key was
    /// missing (a missing count is no pages).
    pub fn from_stat([inactive, active, dirty, writeback]: [Option<u64>; 4]) -> PageCache {
        PageCache {
            inactive: inactive.unwrap_or(0),
            active: active.unwrap_or(0),
            dirty: dirty.unwrap_or(0).saturating_add(writeback.unwrap_or(0)),
        }
    }

    /// What the kernel can drop at once: active and inactive file pages, less those dirty or
    /// under writeback.
    pub fn clean(&self) -> u64 {
        self.inactive
            .saturating_add(self.active)
            .saturating_sub(self.dirty)
    }
}

/// memory.stat's keys for a [`PageCache`] on cgroup `version`: inactive file, active file, dirty,
/// under writeback.
pub fn cache_keys(version: Version) -> [&'static str; 4] {
    match version {
        Version::V1 => [
            "total_inactive_file",
            "total_active_file",
            "total_dirty",
            "total_writeback",
        ],
        Version::V2 => [
            "inactive_file",
            "active_file",
            "file_dirty",
            "file_writeback",
        ],
    }
}

/// The file and cgroup that set a cgroup's effective limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitSource {
    /// `memory.max` or `memory.high` (v2), `memory.limit_in_bytes` (v1).
    pub file: String,
    /// The cgroup whose file it is, as a path inside the hierarchy (`/` for the root): the job's
    /// own, or an ancestor's.
    pub path: String,
}

impl CgroupMemory {
    /// Usage less inactive file cache: kubelet's working set, shown beside
    /// [`CgroupMemory::unreclaimable_bytes`], which is what memwatch decides on.
    pub fn working_set_bytes(&self) -> u64 {
        self.usage_bytes
            .saturating_sub(self.inactive_file_bytes.unwrap_or(0))
    }

    /// Usage less the clean page cache (active and inactive file pages, less those dirty or under
    /// writeback): what the kernel cannot drop before it OOM-kills the cgroup (anonymous memory,
    /// shared memory, kernel memory, dirty pages), swap aside. memwatch's levels, reflexes and room
    /// go by this. Kubelet's working set ([`CgroupMemory::working_set_bytes`]) counts active page
    /// cache as well: a job that reads its dataset every epoch would sit at its line by a cache the
    /// kernel drops as soon as its own memory needs the room. As `MemAvailable` does for the host,
    /// it counts mapped file pages as reclaimable: a job whose own memory leaves too little room for
    /// the code and data it maps thrashes before it is OOM-killed, which memory pressure shows, not
    /// this. Where memory.stat did not say, the cache it did not give counts as unreclaimable.
    pub fn unreclaimable_bytes(&self) -> u64 {
        self.usage_bytes.saturating_sub(self.clean_cache_bytes())
    }

    /// Page cache the kernel can drop at once: active and inactive file pages, less those dirty or
    /// under writeback.
    pub fn clean_cache_bytes(&self) -> u64 {
        PageCache {
            inactive: self.inactive_file_bytes.unwrap_or(0),
            active: self.active_file_bytes.unwrap_or(0),
            dirty: self.dirty_bytes.unwrap_or(0),
        }
        .clean()
    }

    /// Whether its clean page cache is large enough to move its level: half a percent of its limit
    /// (1 MiB without one) or more. A reading between full samples reads the cache again only then
    /// (memory.stat, which the kernel sums first, against one small read of the usage): a cache as
    /// of the last full sample errs by at most what it held.
    pub fn cache_matters(&self) -> bool {
        let least = self.limit_bytes.map_or(1 << 20, |l| (l / 200).max(1 << 20));
        self.clean_cache_bytes() >= least
    }

    /// This reading with `usage` and `cache` as just read (the rest as it was).
    pub fn read_again(&self, usage: u64, cache: PageCache) -> CgroupMemory {
        CgroupMemory {
            usage_bytes: usage,
            inactive_file_bytes: Some(cache.inactive),
            active_file_bytes: Some(cache.active),
            dirty_bytes: Some(cache.dirty),
            ..self.clone()
        }
    }

    /// The job's charged memory: anonymous plus file pages charged to its cgroup, what its limit
    /// counts (kernel memory aside); `None` when memory.stat does not say.
    pub fn charged_bytes(&self) -> Option<u64> {
        Some(self.anon_bytes? + self.file_bytes?)
    }
}

/// Where a memory cgroup's files are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupDir {
    /// Which hierarchy it is in.
    pub version: Version,
    /// The path inside the hierarchy, as /proc/PID/cgroup gives it.
    pub path: String,
    /// Where the hierarchy is mounted.
    pub mount: PathBuf,
    /// The cgroup's directory.
    pub dir: PathBuf,
}

/// Where a process's cgroups live, from `/proc/<pid>/cgroup`: the v1 memory and freezer
/// controllers' paths and the v2 path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The v1 memory controller's path.
    pub v1_memory: Option<String>,
    /// The v1 freezer controller's path.
    pub v1_freezer: Option<String>,
    /// The v2 (unified) path.
    pub v2: Option<String>,
}

/// Parses /proc/PID/cgroup text (`path` names it in errors).
pub fn parse_membership(path: &Path, text: &str) -> Result<Membership, ReadError> {
    let mut m = Membership {
        v1_memory: None,
        v1_freezer: None,
        v2: None,
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(cg)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(ReadError::parse(path, format!("malformed line {line:?}")));
        };
        if !cg.starts_with('/') {
            return Err(ReadError::parse(
                path,
                format!("cgroup path {cg:?} is not absolute"),
            ));
        }
        if id == "0" && controllers.is_empty() {
            m.v2 = Some(cg.to_owned());
        } else {
            for c in controllers.split(',') {
                match c {
                    "memory" => m.v1_memory = Some(cg.to_owned()),
                    "freezer" => m.v1_freezer = Some(cg.to_owned()),
                    _ => {}
                }
            }
        }
    }
    Ok(m)
}

impl CgroupMemory {
    /// Its series: `memwatch_cgroup_memory_{usage,limit}_bytes`, `memwatch_cgroup_oom_kills_total`.
    pub fn series(&self, w: &mut Writer) {
        let cg = self;
        let version = cg.version.to_string();
        let labels = [("cgroup", cg.path.as_str()), ("version", version.as_str())];
        w.gauge(
            "memwatch_cgroup_memory_usage_bytes",
            "Memory charged to memwatch's own memory cgroup.",
        )
        .add(&labels, b(cg.usage_bytes));
        w.gauge(
            "memwatch_cgroup_memory_limit_bytes",
            "Tightest memory limit on the path from memwatch's cgroup to the root; absent when unlimited.",
        )
        .opt(&labels, cg.limit_bytes.map(b));
        w.counter(
            "memwatch_cgroup_oom_kills_total",
            "OOM kills inside memwatch's own memory cgroup.",
        )
        .opt(&labels, cg.oom_kills.map(|n| n as f64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_its_number_on_the_wire() {
        assert_eq!(serde_json::to_string(&Version::V2).unwrap(), "2");
        assert_eq!(serde_json::from_str::<Version>("1").unwrap(), Version::V1);
        let e = serde_json::from_str::<Version>("3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither 1 nor 2"), "{e}");
        assert_eq!(Version::V1.to_string(), "1");
    }

    #[test]
    fn unreclaimable_memory_is_usage_less_clean_page_cache_active_or_inactive() {
        const MIB: u64 = 1 << 20;
        let cg = |inactive, active, dirty| CgroupMemory {
            version: Version::V2,
            path: "/job".into(),
            usage_bytes: 1000 * MIB,
            limit_bytes: Some(1024 * MIB),
            limit_source: None,
            oom_kills: None,
            inactive_file_bytes: inactive,
            active_file_bytes: active,
            dirty_bytes: dirty,
            anon_bytes: None,
            file_bytes: None,
        };
        // A dataset read each epoch: 300 MiB of active cache, 20 MiB inactive.
        let hot = cg(Some(20 * MIB), Some(300 * MIB), Some(0));
        assert_eq!(hot.working_set_bytes(), 980 * MIB, "kubelet's");
        assert_eq!(hot.unreclaimable_bytes(), 680 * MIB);
        // A checkpoint being written: 100 MiB of that cache is dirty, not to be dropped yet.
        let writing = cg(Some(20 * MIB), Some(300 * MIB), Some(100 * MIB));
        assert_eq!(writing.unreclaimable_bytes(), 780 * MIB);
        // memory.stat unread: nothing counts as reclaimable.
        assert_eq!(cg(None, None, None).unreclaimable_bytes(), 1000 * MIB);
        // Dirty pages past the cache (counters read at different moments) drop nothing below zero.
        assert_eq!(cg(Some(MIB), None, Some(5 * MIB)).clean_cache_bytes(), 0);
        let again = hot.read_again(
            900 * MIB,
            PageCache::from_stat([Some(10 * MIB), Some(40 * MIB), Some(2 * MIB), Some(MIB)]),
        );
        assert_eq!(again.unreclaimable_bytes(), 853 * MIB);
        assert_eq!(again.limit_bytes, hot.limit_bytes);
        // Half a percent of 1 GiB, 5.1 MiB, moves a level; 4 KiB does not.
        assert!(hot.cache_matters());
        assert!(!cg(Some(4096), Some(0), Some(0)).cache_matters());
        assert!(!cg(Some(5 * MIB), Some(0), Some(0)).cache_matters());
        assert!(cg(Some(6 * MIB), Some(0), Some(0)).cache_matters());
    }

    #[test]
    fn membership_hybrid_and_hostile() {
        let p = Path::new("cgroup");
        let m = parse_membership(p, "4:memory:/job\n1:cpu,cpuacct:/\n0::/user.slice\n").unwrap();
        assert_eq!(m.v1_memory.as_deref(), Some("/job"));
        assert_eq!(m.v2.as_deref(), Some("/user.slice"));
        assert!(parse_membership(p, "garbage").is_err());
        assert!(parse_membership(p, "0::relative").is_err());
    }
}
