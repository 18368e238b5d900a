//! The ok / warn / critical level of one resource, with separate enter and leave thresholds and hold
//! times so it does not flap. Pure: time comes in as an argument.

use serde::{Deserialize, Serialize};

/// How bad a resource is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Room enough.
    Ok,
    /// Getting close: record, report, adapt.
    Warn,
    /// At the edge: pause what the resource concerns (or only report, if so configured).
    Critical,
}

impl Level {
    /// The number `memwatch_level` reports: 0 ok, 1 warn, 2 critical.
    pub fn gauge(self) -> f64 {
        match self {
            Level::Ok => 0.0,
            Level::Warn => 1.0,
            Level::Critical => 2.0,
        }
    }

    /// The name the API, the events and the metrics use (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Critical => "critical",
        }
    }
}

/// Thresholds on a value where higher is worse. `*_leave` must be below the matching `*_enter`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Warn above this.
    pub warn_enter: f64,
    /// Leave warn below this.
    pub warn_leave: f64,
    /// Critical above this.
    pub critical_enter: f64,
    /// Leave critical below this.
    pub critical_leave: f64,
    /// How long the value must stay past an enter threshold before the level rises.
    pub enter_hold_ms: u64,
    /// How long the value must stay under a leave threshold before the level falls.
    pub leave_hold_ms: u64,
}

/// What is known of a resource in this observation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    /// The resource does not exist here (no swap, no PSI, no limit): it is ok.
    Absent,
    /// It exists but could not be read this time: keep the level as it is.
    Unknown,
    /// Its value (a ratio 0–1, or °C).
    Value(f64),
}

/// A resource's level and the transition it is waiting to make.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LevelState {
    /// Where the resource is.
    pub level: Level,
    /// The level the value points to and since when (ms), while it differs from `level`.
    pub pending: Option<(Level, u64)>,
    /// The last value seen.
    pub value: Option<f64>,
    /// When `level` was entered (ms).
    pub since_ms: u64,
    /// A reading (a value, or the resource's absence) came since this state began: a level that
    /// never had one says nothing yet (a daemon that just started, a probe with no GPU data).
    #[serde(default)]
    pub known: bool,
}

impl LevelState {
    /// Ok since `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        LevelState {
            level: Level::Ok,
            pending: None,
            value: None,
            since_ms: now_ms,
            known: false,
        }
    }

    /// The level to advise and adapt at: `level`, or the lower level the value already points to
    /// while a leave hold keeps `level` (the hold keeps a pause from flapping; what is no longer
    /// full needs no cut). A higher pending level is not entered before the policy enters it.
    pub fn settled(&self) -> Level {
        match self.pending {
            Some((lower, _)) if lower < self.level => lower,
            _ => self.level,
        }
    }
}

/// The level the value points to, given the current level (hysteresis).
pub fn target(current: Level, value: f64, t: &Thresholds) -> Level {
    if value >= t.critical_enter || (current == Level::Critical && value > t.critical_leave) {
        Level::Critical
    } else if value >= t.warn_enter || (current >= Level::Warn && value > t.warn_leave) {
        Level::Warn
    } else {
        Level::Ok
    }
}

/// Advances a level by one observation. Returns the new state.
pub fn step(state: LevelState, reading: Reading, t: &Thresholds, now_ms: u64) -> LevelState {
    let value = match reading {
        Reading::Unknown => return state,
        Reading::Absent => {
            return LevelState {
                level: Level::Ok,
                pending: None,
                value: None,
                known: true,
                since_ms: if state.level == Level::Ok {
                    state.since_ms
                } else {
                    now_ms
                },
            };
        }
        Reading::Value(v) => v,
    };
    let want = target(state.level, value, t);
    if want == state.level {
        return LevelState {
            pending: None,
            value: Some(value),
            known: true,
            ..state
        };
    }
    let since = match state.pending {
        Some((l, since)) if l == want => since,
        _ => now_ms,
    };
    let hold = if want > state.level {
        t.enter_hold_ms
    } else {
        t.leave_hold_ms
    };
    if now_ms.saturating_sub(since) >= hold {
        LevelState {
            level: want,
            pending: None,
            value: Some(value),
            since_ms: now_ms,
            known: true,
        }
    } else {
        LevelState {
            pending: Some((want, since)),
            value: Some(value),
            known: true,
            ..state
        }
    }
}

/// Whether every resource a pause was made for has had a reading since the policy's state began: one
/// that has not (a pause carried over a daemon's restart, before the first full sample reads the
/// GPUs) has not recovered, it is unknown.
pub(super) fn causes_read(
    causes: &[super::Cause],
    levels: &std::collections::BTreeMap<super::Resource, LevelState>,
) -> bool {
    causes.iter().all(|c| match c {
        super::Cause::Resource(r) => levels.get(r).is_some_and(|l| l.known),
        super::Cause::Predicted | super::Cause::WayOut | super::Cause::User => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_names_are_the_serialized_ones_and_the_gauge_orders_them() {
        for (l, n) in [(Level::Ok, 0.0), (Level::Warn, 1.0), (Level::Critical, 2.0)] {
            assert_eq!(serde_json::to_value(l).unwrap(), l.as_str());
            assert_eq!(l.gauge(), n);
        }
    }

    const T: Thresholds = Thresholds {
        warn_enter: 80.0,
        warn_leave: 75.0,
        critical_enter: 90.0,
        critical_leave: 85.0,
        enter_hold_ms: 0,
        leave_hold_ms: 1000,
    };

    /// Runs (time ms, reading) steps and returns the level after each.
    fn run(steps: &[(u64, Reading)], t: &Thresholds) -> Vec<Level> {
        let mut s = LevelState::new(0);
        steps
            .iter()
            .map(|&(now, r)| {
                s = step(s, r, t, now);
                s.level
            })
            .collect()
    }

    use Level::*;
    use Reading::*;

    #[test]
    fn table() {
        type Case = (&'static str, Vec<(u64, Reading)>, Vec<Level>);
        let cases: Vec<Case> = vec![
            (
                "calm",
                vec![(0, Value(10.0)), (100, Value(50.0))],
                vec![Ok, Ok],
            ),
            (
                "straight to critical",
                vec![(0, Value(95.0))],
                vec![Critical],
            ),
            (
                "hovering at the critical line does not flap",
                vec![
                    (0, Value(90.0)),
                    (100, Value(89.0)),
                    (200, Value(90.5)),
                    (300, Value(86.0)),
                    (5000, Value(89.9)),
                ],
                vec![Critical, Critical, Critical, Critical, Critical],
            ),
            (
                "leaving needs the hold time under the leave line",
                vec![
                    (0, Value(95.0)),
                    (100, Value(80.0)),
                    (600, Value(80.0)),
                    (1100, Value(80.0)),
                    (1200, Value(70.0)),
                    (2300, Value(70.0)),
                ],
                vec![Critical, Critical, Critical, Warn, Warn, Ok],
            ),
            (
                "a spike back up restarts the leave hold",
                vec![
                    (0, Value(95.0)),
                    (100, Value(50.0)),
                    (900, Value(95.0)),
                    (1200, Value(50.0)),
                    (2100, Value(50.0)),
                    (2200, Value(50.0)),
                ],
                vec![Critical, Critical, Critical, Critical, Critical, Ok],
            ),
            (
                "unknown keeps the level, absent clears it",
                vec![
                    (0, Value(95.0)),
                    (100, Unknown),
                    (5000, Unknown),
                    (5100, Absent),
                ],
                vec![Critical, Critical, Critical, Ok],
            ),
        ];
        for (name, steps, want) in cases {
            assert_eq!(run(&steps, &T), want, "{name}");
        }
    }

    #[test]
    fn enter_hold_ignores_short_spikes() {
        let t = Thresholds {
            enter_hold_ms: 500,
            ..T
        };
        let got = run(
            &[
                (0, Value(95.0)),
                (200, Value(50.0)),
                (300, Value(95.0)),
                (700, Value(95.0)),
                (800, Value(95.0)),
            ],
            &t,
        );
        assert_eq!(got, vec![Ok, Ok, Ok, Ok, Critical]);
    }

    #[test]
    fn a_leave_hold_settles_at_the_lower_level_an_enter_hold_does_not() {
        let mut l = LevelState::new(0);
        l.level = Level::Critical;
        assert_eq!(l.settled(), Level::Critical);
        l.pending = Some((Level::Ok, 10));
        assert_eq!(l.settled(), Level::Ok);
        l.pending = Some((Level::Warn, 10));
        assert_eq!(l.settled(), Level::Warn);
        l.level = Level::Ok;
        l.pending = Some((Level::Critical, 10));
        assert_eq!(l.settled(), Level::Ok);
    }
}
