//! Who holds a Slurm job's suspension: one entry per node whose memwatch needs the job suspended,
//! kept by Slurm itself in the job's `AdminComment` (only a Slurm administrator may set it, so a
//! job's owner cannot clear another node's hold), as one word `memwatch_hold=NODE@EXPIRY,…` before
//! whatever else the comment says. EXPIRY is a Unix time in seconds: a node that dies while it
//! holds the job holds it no longer than that. This is the pure half (parsing and rendering);
//! memwatch's `act::slurm` reads and writes the comment through scontrol.

/// The word that carries the holds.
const WORD: &str = "memwatch_hold=";

/// One node's hold on a job's suspension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The node (its Slurm node name).
    pub node: String,
    /// Until when it counts, in Unix seconds.
    pub until: u64,
}

/// A job's `AdminComment`, as memwatch's holds and the rest, kept as it was.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holds {
    /// The holds, in the order written.
    pub holds: Vec<Hold>,
    /// What else the comment says.
    pub rest: String,
}

impl Holds {
    /// The holds in `AdminComment`'s value. Entries that do not parse are dropped.
    pub fn parse(comment: &str) -> Holds {
        let comment = comment.trim();
        let (word, rest) = match comment.split_once(char::is_whitespace) {
            Some((w, r)) => (w, r.trim_start()),
            None => (comment, ""),
        };
        let Some(list) = word.strip_prefix(WORD) else {
            return Holds {
                holds: Vec::new(),
                rest: comment.to_owned(),
            };
        };
        let holds = list
            .split(',')
            .filter_map(|e| {
                let (node, until) = e.split_once('@')?;
                let until = until.parse().ok()?;
                (!node.is_empty()).then(|| Hold {
                    node: node.to_owned(),
                    until,
                })
            })
            .collect();
        Holds {
            holds,
            rest: rest.to_owned(),
        }
    }

    /// The comment's new value.
    pub fn render(&self) -> String {
        let word = if self.holds.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = self
                .holds
                .iter()
                .map(|h| format!("{}@{}", h.node, h.until))
                .collect();
            format!("{WORD}{}", list.join(","))
        };
        match (word.is_empty(), self.rest.is_empty()) {
            (_, true) => word,
            (true, false) => self.rest.clone(),
            (false, false) => format!("{word} {}", self.rest),
        }
    }

    /// `node`'s hold, until `until` (added, or its time renewed); the holds that ran out go.
    pub fn with(&self, node: &str, until: u64, now: u64) -> Holds {
        let mut out = self.without(node, now);
        out.holds.push(Hold {
            node: node.to_owned(),
            until,
        });
        out
    }

    /// Without `node`'s hold and those that ran out at `now`.
    pub fn without(&self, node: &str, now: u64) -> Holds {
        Holds {
            holds: self
                .holds
                .iter()
                .filter(|h| h.node != node && h.until > now)
                .cloned()
                .collect(),
            rest: self.rest.clone(),
        }
    }

    /// The nodes other than `node` that hold the job at `now`.
    pub fn others(&self, node: &str, now: u64) -> Vec<String> {
        self.holds
            .iter()
            .filter(|h| h.node != node && h.until > now)
            .map(|h| h.node.clone())
            .collect()
    }

    /// `node`'s hold, if it has one that counts at `now`.
    pub fn of(&self, node: &str, now: u64) -> Option<&Hold> {
        self.holds.iter().find(|h| h.node == node && h.until > now)
    }
}

/// The job's `AdminComment` in `scontrol show job -o`'s one line: the text after the field's name,
/// after `WorkDir=` (fields the job's owner sets, such as its name, come before it; the comment is
/// printed with a space of its own before the next field's, so it ends at two spaces). Empty when
/// the job has none.
pub fn admin_comment(line: &str) -> &str {
    let from = line.find(" WorkDir=").unwrap_or(0);
    let Some(at) = line[from..].find(" AdminComment=") else {
        return "";
    };
    let value = &line[from + at + " AdminComment=".len()..];
    let end = value.find("  ").unwrap_or(value.len());
    value[..end].trim_end_matches('\n').trim_end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_added_renewed_and_dropped_and_the_rest_is_kept() {
        let h = Holds::parse("");
        assert_eq!(h, Holds::default());
        let h = h.with("node1", 400, 100);
        assert_eq!(h.render(), "memwatch_hold=node1@400");
        let h = Holds::parse(&h.with("node2", 500, 100).render());
        assert_eq!(h.render(), "memwatch_hold=node1@400,node2@500");
        assert_eq!(h.others("node2", 100), vec!["node1".to_owned()]);
        // Renewed: one entry, with its new time.
        assert_eq!(
            h.with("node1", 900, 100).render(),
            "memwatch_hold=node2@500,node1@900"
        );
        // node1's ran out at 400: it counts no longer, and a rewrite drops it.
        assert!(h.others("node2", 400).is_empty());
        assert_eq!(h.of("node1", 399).map(|h| h.until), Some(400));
        assert_eq!(h.of("node1", 400), None);
        assert_eq!(h.without("node2", 450).render(), "");
        // An administrator's own words stay, after memwatch's word.
        let h = Holds::parse("reviewed by ops");
        assert!(h.holds.is_empty());
        let h = h.with("n-1.a", 7, 0);
        assert_eq!(h.render(), "memwatch_hold=n-1.a@7 reviewed by ops");
        assert_eq!(
            Holds::parse(&h.render()).without("n-1.a", 0).render(),
            "reviewed by ops"
        );
        // Entries that do not parse are dropped.
        let h = Holds::parse("memwatch_hold=a@1,@5,b@x,c,d@9");
        assert_eq!(
            h.holds,
            vec![
                Hold {
                    node: "a".into(),
                    until: 1
                },
                Hold {
                    node: "d".into(),
                    until: 9
                }
            ]
        );
    }

    #[test]
    fn the_comment_is_read_from_scontrols_line_and_not_from_the_jobs_name() {
        let line = "JobId=7 JobName=x AdminComment=memwatch_hold=evil@99999999999 UserId=a(1) \
                    JobState=SUSPENDED Command=/a WorkDir=/tmp AdminComment=memwatch_hold=node1@400 ops  \
                    Comment=AdminComment=nope  StdErr=/tmp/o\n";
        assert_eq!(admin_comment(line), "memwatch_hold=node1@400 ops");
        assert_eq!(
            admin_comment("JobId=7 JobState=RUNNING WorkDir=/tmp StdErr=/tmp/o"),
            ""
        );
        assert_eq!(
            admin_comment("JobId=7 WorkDir=/tmp AdminComment=memwatch_hold=n@1 \n"),
            "memwatch_hold=n@1"
        );
    }
}
