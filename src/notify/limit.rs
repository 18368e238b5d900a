//! A channel's rate limits: the same kind of notice for the same job at most every
//! `min_interval_seconds`, and at most `max_per_hour` in any hour. Pure: time comes in.

use std::collections::{BTreeMap, VecDeque};

use crate::config::{Channel, NoticeKind};

pub struct Limiter {
    min_interval_ms: u64,
    max_per_hour: usize,
    /// (kind, job) → when one was last admitted, and how many were held back since.
    last: BTreeMap<(NoticeKind, String), (u64, u64)>,
    /// When the notices of the last hour were admitted.
    hour: VecDeque<u64>,
}

const HOUR_MS: u64 = 3_600_000;

impl Limiter {
    pub fn new(c: &Channel) -> Limiter {
        Limiter {
            min_interval_ms: c.min_interval_seconds.saturating_mul(1000),
            max_per_hour: c.max_per_hour as usize,
            last: BTreeMap::new(),
            hour: VecDeque::new(),
        }
    }

    /// `Some(held back since the last one)` when a notice of `kind` for `job` at `now_ms` may go.
    pub fn admit(&mut self, kind: NoticeKind, job: &str, now_ms: u64) -> Option<u64> {
        while self
            .hour
            .front()
            .is_some_and(|t| now_ms.saturating_sub(*t) >= HOUR_MS)
        {
            self.hour.pop_front();
        }
        let key = (kind, job.to_owned());
        let entry = self.last.get(&key).copied();
        let too_soon = entry.is_some_and(|(t, _)| now_ms.saturating_sub(t) < self.min_interval_ms);
        if too_soon || self.hour.len() >= self.max_per_hour {
            let held = self.last.entry(key).or_insert((0, 0));
            held.1 += 1;
            return None;
        }
        let held_back = entry.map_or(0, |(_, n)| n);
        self.last.insert(key, (now_ms, 0));
        self.hour.push_back(now_ms);
        Some(held_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ChannelKind, Secret};

    fn channel(min_interval_seconds: u64, max_per_hour: u32) -> Channel {
        Channel {
            name: "t".into(),
            kind: ChannelKind::Webhook,
            url: Secret("http://127.0.0.1:1/x".into()),
            command: vec![],
            token: Secret::default(),
            events: NoticeKind::ALL.to_vec(),
            min_interval_seconds,
            max_per_hour,
            retries: 0,
            retry_base_ms: 10,
            timeout_seconds: 1,
        }
    }

    #[test]
    fn same_event_same_job_is_held_back_and_counted() {
        let mut l = Limiter::new(&channel(60, 100));
        assert_eq!(l.admit(NoticeKind::Pause, "a", 0), Some(0));
        assert_eq!(l.admit(NoticeKind::Pause, "a", 1_000), None);
        assert_eq!(l.admit(NoticeKind::Pause, "a", 2_000), None);
        // Another job and another kind are not held back.
        assert_eq!(l.admit(NoticeKind::Pause, "b", 2_000), Some(0));
        assert_eq!(l.admit(NoticeKind::Resume, "a", 2_000), Some(0));
        // After the interval, the next one says two were held back.
        assert_eq!(l.admit(NoticeKind::Pause, "a", 61_000), Some(2));
    }

    #[test]
    fn at_most_so_many_an_hour() {
        let mut l = Limiter::new(&channel(0, 3));
        let sent = (0..10)
            .filter(|i| {
                l.admit(NoticeKind::Pause, &format!("j{i}"), i * 1000)
                    .is_some()
            })
            .count();
        assert_eq!(sent, 3);
        assert!(l.admit(NoticeKind::Pause, "late", HOUR_MS + 10).is_some());
    }
}
