//! Which limit a job's memory runs toward: its memory cgroup's, the host's, or a GPU's. Written
//! "cgroup", "host" and "gpu N" wherever it is shown or recorded (the API, the state file).

use serde::{Deserialize, Serialize};

/// Which limit a projection, a pause or a way out is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum LimitKind {
    /// The job's memory cgroup's limit.
    Cgroup,
    /// The host's memory.
    Host,
    /// The memory of the GPU with this NVML index.
    Gpu(u32),
}

impl LimitKind {
    /// Whether it is a limit on RAM (the cgroup's or the host's), not a GPU's.
    pub fn is_ram(self) -> bool {
        matches!(self, LimitKind::Cgroup | LimitKind::Host)
    }
}

impl std::fmt::Display for LimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitKind::Cgroup => f.write_str("cgroup"),
            LimitKind::Host => f.write_str("host"),
            LimitKind::Gpu(i) => write!(f, "gpu {i}"),
        }
    }
}

/// A limit's name that is none of "cgroup", "host" and "gpu N".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown limit {0:?} (expected \"cgroup\", \"host\" or \"gpu N\")")]
pub struct UnknownLimit(pub String);

impl std::str::FromStr for LimitKind {
    type Err = UnknownLimit;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cgroup" => Ok(LimitKind::Cgroup),
            "host" => Ok(LimitKind::Host),
            _ => s
                .strip_prefix("gpu ")
                .and_then(|i| i.parse().ok())
                .map(LimitKind::Gpu)
                .ok_or_else(|| UnknownLimit(s.to_owned())),
        }
    }
}

impl TryFrom<String> for LimitKind {
    type Error = UnknownLimit;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<LimitKind> for String {
    fn from(l: LimitKind) -> String {
        l.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind is written as before it was typed, and read back; anything else is refused by name.
    #[test]
    fn a_limit_is_written_and_read_by_its_old_name() {
        for (kind, name) in [
            (LimitKind::Cgroup, "cgroup"),
            (LimitKind::Host, "host"),
            (LimitKind::Gpu(3), "gpu 3"),
        ] {
            assert_eq!(kind.to_string(), name);
            assert_eq!(name.parse::<LimitKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<LimitKind>(&json).unwrap(), kind);
        }
        for bad in ["", "gpu", "gpu x", "GPU 1", "swap"] {
            let e = bad.parse::<LimitKind>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        assert!(serde_json::from_str::<LimitKind>("\"disk\"").is_err());
    }
}
