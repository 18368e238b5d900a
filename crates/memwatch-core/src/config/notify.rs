//! `[notify]`: who is told when memwatch acts, and how: a generic JSON webhook, a Slack or
//! Mattermost incoming webhook, ntfy, or a command.

use serde::{Deserialize, Serialize, Serializer};

/// What a notification is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// memwatch paused a job (or a way out paused it again).
    Pause,
    /// A paused job runs again.
    Resume,
    /// memwatch stopped a job (its way out, or the longest pause with `on_max_pause = "terminate"`).
    Stop,
    /// `memwatch launch` started a job again after memwatch stopped it.
    Restart,
    /// memwatch staged a change to a job's training config.
    Staged,
    /// The trainer applied a staged change.
    Applied,
    /// The trainer said it applied a change the job does not show.
    Unverified,
    /// A running job will reach a limit within `near_exhaustion_seconds` at its current growth.
    NearExhaustion,
    /// A collector (memory, PSI, NVML …) started failing.
    CollectorDown,
}

impl NoticeKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [NoticeKind; 9] = [
        NoticeKind::Pause,
        NoticeKind::Resume,
        NoticeKind::Stop,
        NoticeKind::Restart,
        NoticeKind::Staged,
        NoticeKind::Applied,
        NoticeKind::Unverified,
        NoticeKind::NearExhaustion,
        NoticeKind::CollectorDown,
    ];

    /// The name the config and the events use.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::Pause => "pause",
            NoticeKind::Resume => "resume",
            NoticeKind::Stop => "stop",
            NoticeKind::Restart => "restart",
            NoticeKind::Staged => "staged",
            NoticeKind::Applied => "applied",
            NoticeKind::Unverified => "unverified",
            NoticeKind::NearExhaustion => "near_exhaustion",
            NoticeKind::CollectorDown => "collector_down",
        }
    }
}

/// How a channel delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelKind {
    /// POST of the event as JSON.
    Webhook,
    /// POST of `{"text": …}` (Slack and Mattermost incoming webhooks).
    Slack,
    /// POST of the message to an ntfy topic URL, with Title, Priority and Tags headers.
    Ntfy,
    /// Runs a program with the event in MEMWATCH_* environment variables.
    Command,
}

/// A secret (a webhook URL with its key, a token): never printed, logged or serialized.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "<secret>"
        })
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { "<secret>" })
    }
}

/// One `[[notify.channels]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Channel {
    /// How logs and metrics name it (never by its URL). Default: KIND-INDEX.
    #[serde(default)]
    pub name: String,
    /// webhook, slack, ntfy or command.
    pub kind: ChannelKind,
    /// webhook, slack, ntfy: where to POST (an ntfy URL names the topic).
    #[serde(default)]
    pub url: Secret,
    /// command: the program (absolute path) and its arguments.
    #[serde(default)]
    pub command: Vec<String>,
    /// webhook, ntfy: sent as `Authorization: Bearer TOKEN`.
    #[serde(default)]
    pub token: Secret,
    /// The kinds of event sent on this channel (all by default).
    #[serde(default = "all_kinds")]
    pub events: Vec<NoticeKind>,
    /// The same kind of event for the same job at most this often; the next one says how many
    /// were held back.
    #[serde(default = "default_min_interval")]
    pub min_interval_seconds: u64,
    /// At most this many notifications an hour on this channel.
    #[serde(default = "default_max_per_hour")]
    pub max_per_hour: u32,
    /// Tries after the first, with backoff doubling from `retry_base_ms`.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The first retry's delay; each later one doubles it.
    #[serde(default = "default_retry_base")]
    pub retry_base_ms: u64,
    /// Each try (request or command) is abandoned after this long.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
}

fn all_kinds() -> Vec<NoticeKind> {
    NoticeKind::ALL.to_vec()
}
fn default_min_interval() -> u64 {
    300
}
fn default_max_per_hour() -> u32 {
    30
}
fn default_retries() -> u32 {
    3
}
fn default_retry_base() -> u64 {
    1000
}
fn default_timeout() -> u64 {
    10
}

/// `[notify]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Notify {
    /// A running job that will reach a limit within this long at its current (sustained) growth
    /// raises a near_exhaustion notification: once, and again only after the job has stayed more
    /// than twice this far from every limit (or stopped growing) for this long without a break.
    pub near_exhaustion_seconds: u64,
    /// The channels, each a `[[notify.channels]]` table (see `notify`). None by default.
    pub channels: Vec<Channel>,
}

impl Default for Notify {
    fn default() -> Self {
        Notify {
            near_exhaustion_seconds: 120,
            channels: Vec::new(),
        }
    }
}

impl Notify {
    /// Checks what serde cannot, and names unnamed channels: (key, why).
    pub fn validate(&mut self) -> Result<(), (String, String)> {
        if !(5..=86_400).contains(&self.near_exhaustion_seconds) {
            return Err((
                "notify.near_exhaustion_seconds".into(),
                format!(
                    "must be from 5 to 86400, got {}",
                    self.near_exhaustion_seconds
                ),
            ));
        }
        for i in 0..self.channels.len() {
            if self.channels[i].name.is_empty() {
                self.channels[i].name = format!("{}-{i}", kind_name(self.channels[i].kind));
            }
            let c = &self.channels[i];
            let err = |k: &str, why: String| Err((format!("notify.channels[{i}].{k}"), why));
            if self.channels[..i].iter().any(|o| o.name == c.name) {
                return err("name", format!("{:?} is used twice", c.name));
            }
            if !c
                .name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
                || c.name.len() > 64
            {
                return err(
                    "name",
                    "use up to 64 letters, digits, '-', '_' or '.'".into(),
                );
            }
            match c.kind {
                ChannelKind::Command => {
                    if !c.command.first().is_some_and(|p| p.starts_with('/')) {
                        return err(
                            "command",
                            "give the program as an absolute path, then its arguments".into(),
                        );
                    }
                }
                _ => {
                    let u = c.url.expose();
                    if !(u.starts_with("http://") || u.starts_with("https://")) || u.len() < 10 {
                        return err("url", "give an http:// or https:// URL".into());
                    }
                }
            }
            if c.events.is_empty() {
                return err("events", "list at least one event".into());
            }
            let ranges: [(&str, u64, u64, u64); 5] = [
                ("min_interval_seconds", c.min_interval_seconds, 0, 86_400),
                ("max_per_hour", u64::from(c.max_per_hour), 1, 3600),
                ("retries", u64::from(c.retries), 0, 10),
                ("retry_base_ms", c.retry_base_ms, 10, 600_000),
                ("timeout_seconds", c.timeout_seconds, 1, 300),
            ];
            for (k, v, lo, hi) in ranges {
                if v < lo || v > hi {
                    return err(k, format!("must be from {lo} to {hi}, got {v}"));
                }
            }
        }
        Ok(())
    }
}

fn kind_name(k: ChannelKind) -> &'static str {
    match k {
        ChannelKind::Webhook => "webhook",
        ChannelKind::Slack => "slack",
        ChannelKind::Ntfy => "ntfy",
        ChannelKind::Command => "command",
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    #[test]
    fn channels_parse_are_named_and_checked() {
        let c = parse(
            "[notify]\n[[notify.channels]]\nkind = \"slack\"\nurl = \"https://hooks.example/T0/B0/k3y\"\n\
             [[notify.channels]]\nname = \"pager\"\nkind = \"command\"\ncommand = [\"/usr/bin/logger\", \"-t\", \"memwatch\"]\nevents = [\"pause\", \"stop\"]\n",
        )
        .unwrap();
        let ch = &c.notify.channels;
        assert_eq!(
            (ch[0].name.as_str(), ch[1].name.as_str()),
            ("slack-0", "pager")
        );
        assert_eq!(ch[0].events.len(), 9);
        // The URL is a secret: not in Debug, not serialized.
        assert!(!format!("{c:?}").contains("k3y"));
        assert!(!toml::to_string(&c).unwrap().contains("k3y"));
        for (text, key) in [
            (
                "kind = \"ntfy\"\nurl = \"ftp://x/y\"\n",
                "notify.channels[0].url",
            ),
            (
                "kind = \"command\"\ncommand = [\"logger\"]\n",
                "notify.channels[0].command",
            ),
            (
                "kind = \"webhook\"\nurl = \"http://127.0.0.1:1/x\"\nevents = []\n",
                "notify.channels[0].events",
            ),
            (
                "kind = \"webhook\"\nurl = \"http://127.0.0.1:1/x\"\nretries = 11\n",
                "notify.channels[0].retries",
            ),
            ("kind = \"pigeon\"\n", "kind"),
        ] {
            let e = parse(&format!("[[notify.channels]]\n{text}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}
