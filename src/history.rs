//! A bounded in-memory history of compact points for `/api/v1/history` and the dashboard.
//!
//! Full samples are large (every sensor, every GPU process); the history keeps only what charts need,
//! so an hour at 1 Hz costs well under a megabyte.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::sample::Sample;

/// One GPU in a history point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPoint {
    /// The GPU's index.
    pub index: u32,
    /// GPU memory in use.
    pub memory_used_bytes: Option<u64>,
    /// GPU memory in all.
    pub memory_total_bytes: Option<u64>,
    /// GPU temperature.
    pub temperature_celsius: Option<f64>,
}

/// One attached job in a history point: what the dashboard charts per job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobPoint {
    /// The job's name.
    pub name: String,
    /// Its processes' resident memory.
    pub rss_bytes: u64,
    /// Its processes' proportional set size.
    pub pss_bytes: u64,
    /// Its GPU memory, where NVML says.
    #[serde(default)]
    pub gpu_bytes: Option<u64>,
    /// Whether memwatch holds it paused.
    pub paused: bool,
}

/// The chartable part of a sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// When the sample was taken (ms since the epoch).
    pub timestamp_ms: u64,
    /// Host RAM in all.
    pub memory_total_bytes: Option<u64>,
    /// MemAvailable.
    pub memory_available_bytes: Option<u64>,
    /// Swap in use.
    pub swap_used_bytes: Option<u64>,
    /// PSI memory "some" over 10 s, 0–1; absent without PSI.
    pub pressure_memory_some_avg10: Option<f64>,
    /// PSI memory "full" over 10 s, 0–1; absent without PSI.
    pub pressure_memory_full_avg10: Option<f64>,
    /// Each GPU.
    pub gpus: Vec<GpuPoint>,
    /// The attached jobs as the daemon saw them at this sample (names and memory: what everyone
    /// may see, docs/api.md).
    #[serde(default)]
    pub jobs: Vec<JobPoint>,
}

impl Point {
    /// The chartable part of `s`, with the attached `jobs`.
    pub fn of(s: &Sample, jobs: &[crate::job::JobView]) -> Point {
        let m = s.host.memory.as_ref();
        let psi = s.host.pressure.memory.as_ref();
        Point {
            timestamp_ms: s.timestamp_ms,
            memory_total_bytes: m.map(|m| m.total_bytes),
            memory_available_bytes: m.map(|m| m.available_bytes),
            swap_used_bytes: m.map(|m| m.swap_used_bytes()),
            pressure_memory_some_avg10: psi.map(|p| p.some.avg10),
            pressure_memory_full_avg10: psi.and_then(|p| p.full).map(|f| f.avg10),
            gpus: s
                .gpus
                .iter()
                .map(|g| GpuPoint {
                    index: g.index,
                    memory_used_bytes: g.memory_used_bytes,
                    memory_total_bytes: g.memory_total_bytes,
                    temperature_celsius: g.temperature_celsius,
                })
                .collect(),
            jobs: jobs
                .iter()
                .filter_map(|j| {
                    let m = j.sample.as_ref()?;
                    Some(JobPoint {
                        name: j.name.clone(),
                        rss_bytes: m.rss_bytes,
                        pss_bytes: m.pss_bytes,
                        gpu_bytes: m.gpu_bytes,
                        paused: j.pause.is_some(),
                    })
                })
                .collect(),
        }
    }
}

/// A ring of the last `capacity` points, oldest first.
#[derive(Debug)]
pub struct History {
    points: VecDeque<Point>,
    capacity: usize,
}

impl History {
    /// A history that keeps the newest `capacity` points.
    pub fn new(capacity: usize) -> Self {
        History {
            points: VecDeque::with_capacity(capacity.min(4096)),
            capacity: capacity.max(1),
        }
    }

    /// Adds a point, dropping the oldest past the capacity.
    pub fn push(&mut self, p: Point) {
        if self.points.len() == self.capacity {
            self.points.pop_front();
        }
        self.points.push_back(p);
    }

    /// Points newer than `ms` (exclusive), oldest first: what a client holding up to `ms` lacks.
    pub fn after(&self, ms: u64) -> Vec<Point> {
        let start = self.points.partition_point(|p| p.timestamp_ms <= ms);
        self.points.range(start..).cloned().collect()
    }

    /// Points no older than `seconds` before the newest point, oldest first.
    pub fn since(&self, seconds: u64) -> Vec<Point> {
        let Some(newest) = self.points.back() else {
            return Vec::new();
        };
        let cutoff = newest
            .timestamp_ms
            .saturating_sub(seconds.saturating_mul(1000));
        let start = self.points.partition_point(|p| p.timestamp_ms < cutoff);
        self.points.range(start..).cloned().collect()
    }

    /// How many points are kept.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether no point is kept.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(ts: u64) -> Point {
        Point::of(
            &Sample {
                timestamp_ms: ts,
                ..Default::default()
            },
            &[],
        )
    }

    #[test]
    fn bounded_and_windowed() {
        let mut h = History::new(3);
        for ts in [1000, 2000, 3000, 4000] {
            h.push(point(ts));
        }
        assert_eq!(h.len(), 3);
        let ts: Vec<u64> = h.since(1).iter().map(|p| p.timestamp_ms).collect();
        assert_eq!(ts, vec![3000, 4000]);
        assert_eq!(h.since(3600).len(), 3);
        assert!(History::new(5).since(10).is_empty());
        // Incremental: what a client holding up to 3000 lacks.
        let ts: Vec<u64> = h.after(3000).iter().map(|p| p.timestamp_ms).collect();
        assert_eq!(ts, vec![4000]);
        assert!(h.after(4000).is_empty());
        assert_eq!(h.after(0).len(), 3);
    }
}
