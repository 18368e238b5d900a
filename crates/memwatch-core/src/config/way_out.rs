//! The way out of a memory pause: the ladder memwatch goes down when the room a paused job needs does
//! not come back by itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One rung of the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    /// Emergency swap (zram, else a swapfile), then the fix now: an urgent directive the trainer
    /// applies at its next step.
    Swap,
    /// Raise the job's own cgroup limit for a while, then the fix now.
    Lend,
    /// Ask for a checkpoint, then stop the whole job cleanly (relaunched by `memwatch launch`).
    Checkpoint,
}

impl Step {
    /// The name the config and the events use.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Swap => "swap",
            Step::Lend => "lend",
            Step::Checkpoint => "checkpoint",
        }
    }
}

/// `[way_out]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WayOut {
    /// The ladder, in order. "swap": emergency swap sized to the shortfall, the job resumed to
    /// apply an urgent fix (a trainer speaking the protocol); the swap is cleared once RAM can take
    /// it back; a job no fix can help now has its held memory pushed out to swap instead, and is
    /// resumed into that room. "lend": the same with the job's own cgroup limit raised for a while (only where
    /// `lend` or `memwatch launch --lend` allows). "checkpoint": ask for a checkpoint, then stop
    /// the whole job cleanly (`memwatch launch` relaunches it with the adapted config). [] disables
    /// the ladder.
    pub steps: Vec<Step>,
    /// How long a memory pause may wait for room to come back by itself before the ladder starts.
    pub decide_seconds: u64,
    /// How long a job resumed with emergency room gets to apply the urgent fix and fit again.
    pub fix_seconds: u64,
    /// Emergency swap and lent memory are the shortfall plus this margin.
    pub swap_margin_mib: u64,
    /// Most emergency swap memwatch adds for one job (zram is also kept under half of
    /// MemAvailable).
    pub swap_max_mib: u64,
    /// Make emergency swap on a zram device where the kernel has zram (/sys/class/zram-control).
    pub zram: bool,
    /// Without zram: a directory on a local disk for an emergency swapfile (never tmpfs). Empty:
    /// none.
    pub swapfile_dir: PathBuf,
    /// Allow the "lend" step for every job whose own cgroup memwatch can write (off: only jobs
    /// started with `memwatch launch --lend`).
    pub lend: bool,
    /// Most memory lent to one job's cgroup; never more than the host can spare above its warn
    /// level.
    pub lend_max_mib: u64,
    /// After a checkpoint request, how long to wait for the trainer's acknowledgement (or its exit)
    /// before the job is stopped.
    pub checkpoint_grace_seconds: u64,
}

impl Default for WayOut {
    fn default() -> Self {
        WayOut {
            steps: vec![Step::Swap, Step::Lend, Step::Checkpoint],
            decide_seconds: 5,
            fix_seconds: 60,
            swap_margin_mib: 256,
            swap_max_mib: 8192,
            zram: true,
            swapfile_dir: PathBuf::new(),
            lend: false,
            lend_max_mib: 4096,
            checkpoint_grace_seconds: 60,
        }
    }
}

impl WayOut {
    /// Checks what serde cannot: (key, why).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let err = |k: &str, why: String| Err((format!("way_out.{k}"), why));
        for (i, s) in self.steps.iter().enumerate() {
            if self.steps[..i].contains(s) {
                return err("steps", format!("\"{}\" is listed twice", s.as_str()));
            }
        }
        let ranges: [(&str, u64, u64, u64); 6] = [
            ("decide_seconds", self.decide_seconds, 1, 600),
            ("fix_seconds", self.fix_seconds, 1, 3600),
            ("swap_margin_mib", self.swap_margin_mib, 0, 1 << 20),
            ("swap_max_mib", self.swap_max_mib, 16, 1 << 22),
            ("lend_max_mib", self.lend_max_mib, 1, 1 << 22),
            (
                "checkpoint_grace_seconds",
                self.checkpoint_grace_seconds,
                1,
                3600,
            ),
        ];
        for (k, v, lo, hi) in ranges {
            if v < lo || v > hi {
                return err(k, format!("must be from {lo} to {hi}, got {v}"));
            }
        }
        if self.swap_max_mib < self.swap_margin_mib {
            return err(
                "swap_max_mib",
                format!(
                    "must not be below swap_margin_mib ({})",
                    self.swap_margin_mib
                ),
            );
        }
        if !self.swapfile_dir.as_os_str().is_empty() && !self.swapfile_dir.is_absolute() {
            return err(
                "swapfile_dir",
                format!("{}: give an absolute path", self.swapfile_dir.display()),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bad_ladders_are_refused_with_their_key() {
        let parse = |t: &str| crate::config::load::parse(t).map_err(|e| e.to_string());
        let e = parse("[way_out]\nsteps = [\"swap\", \"swap\"]\n").unwrap_err();
        assert!(e.contains("way_out.steps") && e.contains("twice"), "{e}");
        let e = parse("[way_out]\nsteps = [\"pray\"]\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("pray"), "{e}");
        let e = parse("[way_out]\ndecide_seconds = 0\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("decide_seconds"), "{e}");
        let e = parse("[way_out]\nswapfile_dir = \"swap\"\n").unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let c = parse("[way_out]\nsteps = []\n").unwrap();
        assert!(c.way_out.steps.is_empty());
    }
}
