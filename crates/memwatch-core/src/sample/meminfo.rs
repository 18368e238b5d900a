//! /proc/meminfo: RAM, swap and commit figures, in bytes.

use std::path::Path;

use crate::expo::{Writer, bytes as b};
use serde::{Deserialize, Serialize};

use super::error::{ReadError, parse_u64};

/// What /proc/meminfo says, converted to bytes. Fields older kernels lack are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemInfo {
    /// MemTotal.
    pub total_bytes: u64,
    /// MemFree.
    pub free_bytes: u64,
    /// MemAvailable: what can be had without swapping.
    pub available_bytes: u64,
    /// Buffers.
    pub buffers_bytes: Option<u64>,
    /// Cached (page cache).
    pub cached_bytes: Option<u64>,
    /// Shmem (tmpfs, shared memory).
    pub shmem_bytes: Option<u64>,
    /// Committed_AS: memory promised to processes.
    pub committed_as_bytes: Option<u64>,
    /// CommitLimit.
    pub commit_limit_bytes: Option<u64>,
    /// SwapTotal.
    pub swap_total_bytes: u64,
    /// SwapFree.
    pub swap_free_bytes: u64,
    /// SwapCached.
    pub swap_cached_bytes: Option<u64>,
}

impl MemInfo {
    /// Memory in use: total less available.
    pub fn used_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.available_bytes)
    }
    /// Swap in use.
    pub fn swap_used_bytes(&self) -> u64 {
        self.swap_total_bytes.saturating_sub(self.swap_free_bytes)
    }
}

/// Parses meminfo text. Values carry a `kB` unit (KiB); a value without a unit is a count and is skipped.
pub fn parse(path: &Path, text: &str) -> Result<MemInfo, ReadError> {
    let mut fields: Vec<(&str, u64)> = Vec::with_capacity(64);
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(value), Some("kB")) = (words.next(), words.next()) else {
            continue;
        };
        let kib = parse_u64(path, key, value)?;
        let bytes = kib
            .checked_mul(1024)
            .ok_or_else(|| ReadError::parse(path, format!("{key}: {kib} kB overflows")))?;
        fields.push((key, bytes));
    }
    let get = |k: &str| fields.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
    let need = |k: &str| get(k).ok_or_else(|| ReadError::parse(path, format!("no {k} line")));
    let total = need("MemTotal")?;
    let free = need("MemFree")?;
    Ok(MemInfo {
        total_bytes: total,
        free_bytes: free,
        // Kernels before 3.14 lack MemAvailable; MemFree is the conservative stand-in.
        available_bytes: get("MemAvailable").unwrap_or(free),
        buffers_bytes: get("Buffers"),
        cached_bytes: get("Cached"),
        shmem_bytes: get("Shmem"),
        committed_as_bytes: get("Committed_AS"),
        commit_limit_bytes: get("CommitLimit"),
        swap_total_bytes: get("SwapTotal").unwrap_or(0),
        swap_free_bytes: get("SwapFree").unwrap_or(0),
        swap_cached_bytes: get("SwapCached"),
    })
}

impl MemInfo {
    /// Its series: `memwatch_memory_*_bytes`, `memwatch_swap_*_bytes`.
    pub fn series(&self, w: &mut Writer) {
        w.gauge("memwatch_memory_total_bytes", "Usable RAM (MemTotal).")
            .add(&[], b(self.total_bytes));
        w.gauge(
            "memwatch_memory_available_bytes",
            "RAM available for new work without swapping (MemAvailable).",
        )
        .add(&[], b(self.available_bytes));
        w.gauge(
            "memwatch_memory_free_bytes",
            "RAM not used at all (MemFree).",
        )
        .add(&[], b(self.free_bytes));
        w.gauge("memwatch_memory_cached_bytes", "Page cache (Cached).")
            .opt(&[], self.cached_bytes.map(b));
        w.gauge(
            "memwatch_memory_buffers_bytes",
            "Block device buffers (Buffers).",
        )
        .opt(&[], self.buffers_bytes.map(b));
        w.gauge(
            "memwatch_memory_shmem_bytes",
            "Shared memory and tmpfs (Shmem).",
        )
        .opt(&[], self.shmem_bytes.map(b));
        w.gauge(
            "memwatch_memory_committed_bytes",
            "Memory promised to processes (Committed_AS).",
        )
        .opt(&[], self.committed_as_bytes.map(b));
        w.gauge(
            "memwatch_memory_commit_limit_bytes",
            "The commit limit (CommitLimit).",
        )
        .opt(&[], self.commit_limit_bytes.map(b));
        w.gauge("memwatch_swap_total_bytes", "Swap space (SwapTotal).")
            .add(&[], b(self.swap_total_bytes));
        w.gauge("memwatch_swap_free_bytes", "Unused swap space (SwapFree).")
            .add(&[], b(self.swap_free_bytes));
        w.gauge(
            "memwatch_swap_cached_bytes",
            "Memory both in RAM and in swap (SwapCached).",
        )
        .opt(&[], self.swap_cached_bytes.map(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<MemInfo, ReadError> {
        parse(Path::new("meminfo"), text)
    }

    #[test]
    fn reads_real_layout() {
        let m = p(
            "MemTotal:       32768000 kB\nMemFree:  1000 kB\nMemAvailable: 2000 kB\n\
                   Buffers: 10 kB\nCached: 20 kB\nSwapCached: 3 kB\nSwapTotal: 4096 kB\n\
                   SwapFree: 1024 kB\nShmem: 7 kB\nCommitLimit: 100 kB\nCommitted_AS: 200 kB\n\
                   HugePages_Total:       0\n",
        )
        .unwrap();
        assert_eq!(m.total_bytes, 32_768_000 * 1024);
        assert_eq!(m.available_bytes, 2000 * 1024);
        assert_eq!(m.swap_used_bytes(), 3072 * 1024);
        assert_eq!(m.committed_as_bytes, Some(200 * 1024));
    }

    #[test]
    fn hostile_input_is_an_error_not_a_panic() {
        for text in [
            "",
            "garbage\n\0\u{1}",
            "MemTotal: 1 kB\n",
            "MemTotal: x kB\nMemFree: 1 kB\n",
            "MemTotal: 99999999999999999999 kB\nMemFree: 1 kB\n",
            "MemTotal: 18446744073709551615 kB\nMemFree: 1 kB\n",
            "MemTotal: -5 kB\nMemFree: 1 kB\n",
        ] {
            assert!(p(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn truncated_file_without_memavailable_falls_back_to_free() {
        let m = p("MemTotal: 100 kB\nMemFree: 40 kB\nMemAv").unwrap();
        assert_eq!(m.available_bytes, 40 * 1024);
        assert_eq!(m.swap_total_bytes, 0);
    }
}
