//! Pausing and resuming a whole process tree.
//!
//! Pause is top-down: the root first (through its pidfd, before any walk), so it cannot fork new
//! workers, then the processes pinned at the job's last walk (their pidfds, no read first), then
//! whatever a walk of the tree finds that is not stopped yet, and the tree is walked again until a
//! walk finds nothing new to stop (a worker forked between walks is caught).
//! Resume is bottom-up: workers first, so the parent finds them running when it wakes. Processes that
//! were already stopped before the pause (a user's Ctrl-Z) are left as they were.

use std::path::Path;

use nix::sys::signal::Signal;

use std::os::fd::OwnedFd;

use std::collections::{HashMap, HashSet};

use super::as_owner::AsOwner;
use super::pin::Pinned;
use super::signal::{SignalError, alive, owner_may_signal, pidfd_open, send, send_pinned};
use crate::proc::{ProcRef, children_files, children_of, parent_map, read_stat};

/// The most walks a pause makes before it settles for what it stopped.
const MAX_WALKS: usize = 8;

/// Stops the tree under `root_ref` on behalf of user `owner`. Returns the processes this call stopped,
/// root first. With `pinned` (the pidfd kept since attach) the root is checked and signalled through
/// it. Only processes the owner could signal themselves are stopped: a root that is out of reach
/// refuses the pause, a descendant out of reach (a `sudo` child) is left running and its own children
/// are still walked. Where the daemon runs as root, the signals of a user's job go out with that
/// user's uids ([`AsOwner`]) and the kernel's kill(2) check decides, at the signal itself; else the
/// process's uids are read first ([`owner_may_signal`], on the pinned process just before its
/// signal).
///
/// The root is stopped first, before any walk. Each child found in the walk gets a pidfd *before* its
/// stat is read, so one read of /proc/PID/stat both identifies it (its parent is the process whose
/// children list named it) and pins it: a pid recycled after the pidfd was opened makes the signal
/// fail with "gone", never hit the newcomer. That stat also says whether the child has one thread:
/// the first walk then reads its children from that thread's file alone. Then the tree is walked
/// again, reading every thread's children list, until a walk finds nothing new (a worker forked
/// between walks, or by a thread started since its stat was read, is caught).
///
/// `members`, the tree's processes pinned at the job's last walk ([`pin_members`](super::pin::pin_members)), are stopped
/// right after the root, through their descriptors, with no read (the owner's check is the
/// kernel's, or a read of each one's uids where the daemon cannot take the owner's): a tree that did not change since is stopped at the kernel's cost per signal, and the
/// walks then only look for what is new. A member gone since is skipped, and so is one whose parent
/// is not the root or a member stopped here and alive: it may have left the tree (its parent
/// exited), where the recovery after a crash, which continues the stopped members of the job's tree,
/// would not find it. Members come in the walk's order, parents before their children. One a user
/// stopped by hand since the walk (a walk never pins a stopped one) is counted as the pause's, and
/// continued with it: its state is not read first.
pub fn stop_tree(
    root: &Path,
    root_ref: ProcRef,
    pinned: Option<&OwnedFd>,
    owner: u32,
    members: &[Pinned],
) -> Result<Vec<ProcRef>, SignalError> {
    // Signals go out with the owner's uids where the daemon can take them, so the kernel's own
    // kill(2) check decides each one (`AsOwner`); else each process's uids are read first.
    let sender = Sender::new(owner);
    let mut stopped: Vec<ProcRef> = Vec::new();
    match stop_all(root, root_ref, pinned, &sender, members, &mut stopped) {
        Ok(()) => Ok(stopped),
        Err(e) => {
            // Undo: never leave half a tree stopped.
            resume(root, &stopped, pinned);
            Err(e)
        }
    }
}

/// Who checks that the job's owner could send a signal itself.
struct Sender {
    owner: u32,
    /// The kernel, at the signal: the daemon may take the owner's uids on this thread.
    kernel: bool,
}

impl Sender {
    fn new(owner: u32) -> Sender {
        Sender {
            owner,
            kernel: owner != 0 && AsOwner::take(owner).is_some(),
        }
    }

    /// Whether `pid` may be signalled for the owner as far as a read can tell: always when the
    /// kernel checks at the signal.
    fn may(&self, root: &Path, pid: u32) -> bool {
        self.kernel || owner_may_signal(root, pid, self.owner)
    }

    /// Sends `SIGSTOP` with the owner's uids where the kernel checks, else with the daemon's.
    fn stop(
        &self,
        pid: u32,
        send: impl FnOnce() -> Result<(), SignalError>,
    ) -> Result<(), SignalError> {
        let _as = if self.kernel {
            AsOwner::take(self.owner)
        } else {
            None
        };
        if self.kernel && _as.is_none() {
            // Taken a moment ago, refused now: refuse the signal rather than send it unchecked.
            return Err(SignalError::Other {
                pid,
                reason: "could not take the job owner's uids to signal as them".into(),
            });
        }
        send()
    }
}

/// [`stop_tree`]'s work; `stopped` holds what it stopped, root first, also when it fails.
fn stop_all(
    root: &Path,
    root_ref: ProcRef,
    pinned: Option<&OwnedFd>,
    sender: &Sender,
    members: &[Pinned],
    stopped: &mut Vec<ProcRef>,
) -> Result<(), SignalError> {
    if !sender.may(root, root_ref.pid) {
        return Err(SignalError::Denied(root_ref.pid));
    }
    match pinned {
        Some(fd) => {
            if !alive(fd, root_ref.pid) {
                return Err(SignalError::Gone(root_ref.pid));
            }
            sender.stop(root_ref.pid, || {
                send_pinned(fd, root_ref.pid, Signal::SIGSTOP)
            })?;
        }
        None => sender.stop(root_ref.pid, || send(root, root_ref, Signal::SIGSTOP))?,
    }
    stopped.push(root_ref);
    let mut known: HashSet<u32> = HashSet::from([root_ref.pid]);
    // The processes still holding their place in the tree: the root, and members stopped here that
    // have not exited (asked only of those that are some member's parent).
    let parents: HashSet<u32> = members.iter().map(|m| m.parent).collect();
    let mut in_tree: HashSet<u32> = HashSet::from([root_ref.pid]);
    {
        // One change of uids for all the members: between their signals nothing is read.
        let _as = if sender.kernel {
            AsOwner::take(sender.owner)
        } else {
            None
        };
        let checked = _as.is_some();
        for m in members {
            if known.contains(&m.proc.pid)
                || !in_tree.contains(&m.parent)
                || (!checked && !owner_may_signal(root, m.proc.pid, sender.owner))
            {
                continue;
            }
            match send_pinned(m.fd(), m.proc.pid, Signal::SIGSTOP) {
                Ok(()) => {
                    stopped.push(m.proc);
                    known.insert(m.proc.pid);
                    if parents.contains(&m.proc.pid) && alive(m.fd(), m.proc.pid) {
                        in_tree.insert(m.proc.pid);
                    }
                }
                // Out of the owner's reach, said by the kernel: the walk leaves it running.
                Err(SignalError::Gone(_)) | Err(SignalError::Denied(_)) if checked => {}
                Err(SignalError::Gone(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    let mut fallback: Option<HashMap<u32, Vec<u32>>> = None;
    // The first walk's threads per process, read from the stat that identified it before its signal:
    // a single-threaded process's children are read from its one thread's file. The walks after it
    // list every thread, so a child forked by a thread started meanwhile is still caught.
    let mut threads: HashMap<u32, u32> = HashMap::new();
    for walk in 0..MAX_WALKS {
        let mut new = 0;
        let mut queue = vec![root_ref.pid];
        let mut visited: HashSet<u32> = HashSet::from([root_ref.pid]);
        let mut i = 0;
        while i < queue.len() {
            let parent = queue[i];
            i += 1;
            let listed = match threads.get(&parent) {
                Some(&n) if walk == 0 => children_of(root, parent, n),
                _ => children_files(root, parent),
            };
            let kids = match listed {
                Some(k) => k,
                None => fallback
                    .get_or_insert_with(|| parent_map(root))
                    .get(&parent)
                    .cloned()
                    .unwrap_or_default(),
            };
            for kid in kids {
                if !visited.insert(kid) {
                    continue;
                }
                queue.push(kid);
                if known.contains(&kid) {
                    continue;
                }
                if let Some((r, n)) = stop_child(root, kid, parent, sender)? {
                    threads.insert(kid, n);
                    stopped.push(r);
                    new += 1;
                }
                known.insert(kid);
            }
        }
        if new == 0 {
            break;
        }
    }
    Ok(())
}

/// Stops `pid` if it is a running child of `parent` that the owner could signal; with its threads as
/// its stat showed them. `Ok(None)`: gone, no longer that parent's child, already stopped by someone
/// else (a user's Ctrl-Z stays theirs to undo), or out of the owner's reach.
fn stop_child(
    root: &Path,
    pid: u32,
    parent: u32,
    sender: &Sender,
) -> Result<Option<(ProcRef, u32)>, SignalError> {
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(SignalError::Gone(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Ok(s) = read_stat(root, pid) else {
        return Ok(None);
    };
    if s.ppid != parent || s.state == 'Z' || s.is_stopped() {
        return Ok(None);
    }
    let beyond = || {
        tracing::warn!(
            pid,
            owner = sender.owner,
            "left a process of the job running: its user could not signal it (it runs as another user)"
        );
        Ok(None)
    };
    // Read after the pidfd pinned the process: these are its uids, not a newcomer's.
    if !sender.may(root, pid) {
        return beyond();
    }
    let r = s.proc_ref();
    let sent = sender.stop(pid, || match &fd {
        Some(fd) => send_pinned(fd, pid, Signal::SIGSTOP),
        None => send(root, r, Signal::SIGSTOP),
    });
    match sent {
        Ok(()) => Ok(Some((r, s.threads))),
        Err(SignalError::Gone(_)) => Ok(None),
        Err(SignalError::Denied(_)) if sender.kernel => beyond(),
        Err(e) => Err(e),
    }
}

/// Continues the processes `stopped` names, children before parents. Returns those that are gone. The
/// first of `stopped` is the root: with `pinned` it is continued through that pidfd.
pub fn resume(root: &Path, stopped: &[ProcRef], pinned: Option<&OwnedFd>) -> Vec<ProcRef> {
    let mut gone = Vec::new();
    for (i, r) in stopped.iter().enumerate().rev() {
        let result = match pinned {
            Some(fd) if i == 0 => send_pinned(fd, r.pid, Signal::SIGCONT),
            _ => send(root, *r, Signal::SIGCONT),
        };
        if let Err(e) = result {
            tracing::debug!(pid = r.pid, error = %e, "could not continue a paused process");
            gone.push(*r);
        }
    }
    gone
}

/// Whether every process in `refs` that still exists is stopped (the pause has taken effect).
pub fn all_stopped(root: &Path, refs: &[ProcRef]) -> bool {
    refs.iter().all(|r| match read_stat(root, r.pid) {
        Ok(s) if s.start_time == r.start_time => s.is_stopped(),
        _ => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::pin::{MAX_PINNED, pin_members};
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// The root forks a worker; the worker's second thread forks one child and its main thread
    /// another. Prints the worker's pid, then its two children's.
    const TREE: &str = r#"
import os, threading, time
r, w = os.pipe()
k = os.fork()
if k == 0:
    def second():
        g = os.fork()
        if g == 0:
            time.sleep(600); os._exit(0)
        os.write(w, b"%d\n" % g)
        time.sleep(600)
    threading.Thread(target=second, daemon=True).start()
    h = os.fork()
    if h == 0:
        time.sleep(600); os._exit(0)
    os.write(w, b"%d\n" % h)
    time.sleep(600); os._exit(0)
print(k, flush=True)
f = os.fdopen(r)
print(f.readline().strip(), flush=True)
print(f.readline().strip(), flush=True)
time.sleep(600)
"#;

    /// Runs `script` in python3, its output's lines read as they come.
    fn python(
        script: &str,
    ) -> (
        std::process::Child,
        std::io::Lines<BufReader<std::process::ChildStdout>>,
    ) {
        let mut job = Command::new("python3")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(job.stdout.take().unwrap()).lines();
        (job, lines)
    }

    /// Whether every process of `stopped` settled stopped, then whether each was running again after
    /// `resume` continued them all.
    fn settled_then_resumed(stopped: &[ProcRef]) -> (bool, bool) {
        let took = settled(stopped, true);
        assert!(resume(Path::new("/"), stopped, None).is_empty());
        (took, settled(stopped, false))
    }

    /// Waits up to 10 s for every process in `refs` to show `stopped`.
    fn settled(refs: &[ProcRef], stopped: bool) -> bool {
        let root = Path::new("/");
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if refs
                .iter()
                .all(|r| read_stat(root, r.pid).is_ok_and(|s| s.is_stopped() == stopped))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn a_child_forked_by_a_workers_second_thread_is_stopped_with_the_tree() {
        let root = Path::new("/");
        let (mut job, mut lines) = python(TREE);
        let mut pid = || -> u32 { lines.next().unwrap().unwrap().trim().parse().unwrap() };
        let (worker, a, b) = (pid(), pid(), pid());
        let stat = read_stat(root, worker).unwrap();
        assert_eq!(stat.threads, 2, "the worker runs two threads");
        // One of its children hangs off the second thread, where its main thread's list does not
        // show it: only a listing of every thread finds both.
        let main_only = children_of(root, worker, 1).unwrap();
        let every = children_files(root, worker).unwrap();
        assert_eq!(main_only.len(), 1, "{main_only:?}");
        assert!(every.contains(&a) && every.contains(&b), "{every:?}");
        assert_eq!(children_of(root, worker, stat.threads).unwrap().len(), 2);

        let job_ref = read_stat(root, job.id()).unwrap().proc_ref();
        let stopped = stop_tree(root, job_ref, None, 0, &[]).unwrap();
        let pids: HashSet<u32> = stopped.iter().map(|r| r.pid).collect();
        let cleanup = |job: &mut std::process::Child| {
            for p in [a, b, worker] {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), Signal::SIGKILL);
            }
            let _ = job.kill();
            let _ = job.wait();
        };
        let all = HashSet::from([job.id(), worker, a, b]);
        if pids != all {
            cleanup(&mut job);
            panic!("stopped {pids:?}, the tree is {all:?}");
        }
        let (took, back) = settled_then_resumed(&stopped);
        cleanup(&mut job);
        assert!(took, "not every process stopped");
        assert!(back, "not every process continued");
    }

    /// A root with three sleeping children, the last of which has a child of its own; on SIGUSR1
    /// it forks one more. Prints the three's pids and the grandchild's on one line, then each new
    /// child's.
    const FORKER: &str = r#"
import os, signal, time
def spawn():
    k = os.fork()
    if k == 0:
        time.sleep(600); os._exit(0)
    return k
r, w = os.pipe()
kids = [spawn(), spawn()]
k = os.fork()
if k == 0:
    g = os.fork()
    if g == 0:
        time.sleep(600); os._exit(0)
    os.write(w, b"%d\n" % g)
    time.sleep(600); os._exit(0)
kids.append(k)
print(*kids, int(os.fdopen(r).readline()), flush=True)
signal.signal(signal.SIGUSR1, lambda *a: print(spawn(), flush=True))
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(600)
"#;

    /// The processes pinned at a walk are stopped through their descriptors, root first and then in
    /// the pinning's order (here the reverse of the children lists', which a walk follows): one that
    /// exited since is skipped, and so is its child, whose parent exited (it left the tree, where a
    /// recovery would not find it); one forked since is found by the walk after them. A later
    /// pinning keeps the descriptors of those still alive.
    #[test]
    fn pinned_members_are_stopped_first_and_the_walk_finds_what_is_new() {
        let root = Path::new("/");
        let (mut job, mut lines) = python(FORKER);
        let me = job.id();
        let mut kids: Vec<u32> = lines
            .next()
            .unwrap()
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        let Some(grandchild) = kids.pop() else {
            panic!("no pids")
        };
        let mut walked: Vec<(u32, u32)> = kids.iter().rev().map(|&k| (k, me)).collect();
        walked.push((grandchild, kids[2]));
        let pins = pin_members(root, &walked, &[], MAX_PINNED);
        // kids[2] (the grandchild's parent), kids[1], kids[0], the grandchild.
        let refs: Vec<ProcRef> = walked
            .iter()
            .map(|&(k, _)| read_stat(root, k).unwrap().proc_ref())
            .collect();
        assert_eq!(pins.iter().map(|p| p.proc).collect::<Vec<_>>(), refs);
        assert_eq!(pin_members(root, &walked, &[], 2).len(), 2, "the limit");

        // The grandchild's parent exits (the root reaps it): the grandchild leaves the tree. The
        // root forks a new one.
        let kill = |pid: u32, sig: Signal| {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
        };
        kill(kids[2], Signal::SIGKILL);
        let until = Instant::now() + Duration::from_secs(10);
        while read_stat(root, kids[2]).is_ok() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_ne!(read_stat(root, grandchild).unwrap().ppid, kids[2]);
        kill(me, Signal::SIGUSR1);
        let new: u32 = lines.next().unwrap().unwrap().trim().parse().unwrap();

        let job_ref = read_stat(root, me).unwrap().proc_ref();
        let stopped = stop_tree(root, job_ref, None, 0, &pins).unwrap();
        let new_ref = read_stat(root, new).unwrap().proc_ref();
        let cleanup = |job: &mut std::process::Child| {
            for &p in kids.iter().chain([&new, &grandchild]) {
                kill(p, Signal::SIGKILL);
            }
            let _ = job.kill();
            let _ = job.wait();
        };
        let expected = vec![job_ref, refs[1], refs[2], new_ref];
        if stopped != expected {
            cleanup(&mut job);
            panic!("stopped {stopped:?}, expected {expected:?}");
        }
        let (took, back) = settled_then_resumed(&stopped);

        // Pinned again at the next walk: the two still alive keep their descriptors.
        let walked = [(kids[1], me), (kids[0], me), (new, me)];
        let again = pin_members(root, &walked, &pins, MAX_PINNED);
        cleanup(&mut job);
        assert!(took, "not every process stopped");
        assert!(back, "not every process continued");
        assert_eq!(
            again.iter().map(|p| p.proc).collect::<Vec<_>>(),
            vec![refs[1], refs[2], new_ref]
        );
        assert!(std::ptr::eq(again[0].fd(), pins[1].fd()));
        assert!(std::ptr::eq(again[1].fd(), pins[2].fd()));
    }
}
