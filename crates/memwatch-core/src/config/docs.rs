//! The documentation of every setting, by dotted key: the source of the comments in
//! memwatch.example.toml, and of `memwatch config example`. A test fails when a setting has none.

/// Every documented key: [`DOCS`], then each resource's `[policy.KEY]` table
/// (`config::policy::RESOURCE_DOCS`, beside its settings).
pub fn every() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    DOCS.iter().chain(super::policy::RESOURCE_DOCS)
}

/// One line of documentation for every setting but a resource's own table, by dotted key, in file
/// order.
pub const DOCS: &[(&str, &str)] = &[
    (
        "listen",
        "Address of the HTTP server: /metrics, the JSON API and the dashboard. It has no authentication:\n\
         keep it on loopback unless a proxy in front of it authenticates.",
    ),
    (
        "sampling",
        "How often memwatch samples and how much history it keeps in memory.",
    ),
    (
        "sampling.interval_ms",
        "Sampling interval in milliseconds (10 to 3600000). 1000 costs well under 1 % of a core.",
    ),
    (
        "sampling.calm_interval_ms",
        "Full-sample interval while all is calm and the kernel watches for change (10 to 3600000): every
level ok and none within 5 points of warn, nothing paused, every job's cgroup under kernel memory
thresholds (cgroup v1) or read by the daemon's wake thread in their stead (cgroup v2), using no GPU
and not over its critical line by page cache, the host's pressure under a PSI trigger. The host's MemAvailable is still read between full
samples as often as 4 GiB/s of growth could use the room above its critical line (at most every
probe_interval_ms), and a read of the data (/metrics, the JSON API, the dashboard, the CLI) takes a
fresh sample when the last is older than interval_ms. At or below interval_ms: never stretched.",
    ),
    (
        "sampling.history_seconds",
        "Seconds of history kept in memory for /api/v1/history and the dashboard (60 to 604800).",
    ),
    ("host", "Where host data is read from."),
    (
        "host.root",
        "Root under which /proc and /sys are read. \"/\" on a real machine; a fixture tree in tests.",
    ),
    ("gpu", "GPU sampling through NVIDIA's NVML."),
    (
        "gpu.enabled",
        "Sample GPUs. Without a driver or a GPU the GPU section stays empty and the daemon runs on.",
    ),
    (
        "gpu.library",
        "The NVML library to load: a file name searched on the library path, or an absolute path.",
    ),
    ("http", "Limits of the HTTP server."),
    (
        "http.max_connections",
        "Most connections open at once. When all are open, a new one takes the place of the one idle\n\
         longest (never one with a request in flight); only when every one is busy does it wait.",
    ),
    (
        "http.max_body_bytes",
        "Largest request body accepted, in bytes.",
    ),
    (
        "http.request_timeout_ms",
        "Most time a client gets to send a request (headers and body) and to read each part of the\n\
         answer; an idle keep-alive connection is closed after it too. 10 ms to 1 h.",
    ),
    (
        "log",
        "Logging. RUST_LOG, --log-level and --log-format override these.",
    ),
    ("log.level", "One of error, warn, info, debug, trace."),
    (
        "log.format",
        "text (for people) or json (one object per line, for log shippers).",
    ),
    (
        "sampling.probe_interval_ms",
        "While a job is attached and its memory cgroup is not watched (no cgroup v1 thresholds, no\n\
         cgroup v2 reads by the daemon's wake thread, or its usage over its critical line by page cache\n\
         that holds its level under, where usage barely moves as it grows), or a level is raised, the\n\
         job's cgroup and the host's MemAvailable are probed this often (cheap reads; the cgroup's page\n\
         cache too where it could move its level) between full samples, so fast growth\n\
         is seen within this time (the host once it is half used, or once the room above its critical\n\
         line is less than 4 GiB/s of growth would take in one interval_ms). While every job's cgroup\n\
         is watched and every level is ok, only the host's MemAvailable is read, as often as 4 GiB/s\n\
         of growth could use the room above its critical line and never more often than this.",
    ),
    (
        "sampling.fast_interval_ms",
        "Probe interval while any level is warn or worse, or a job is projected to run out of memory\n\
         within a few seconds. Must not be above probe_interval_ms.",
    ),
    (
        "sampling.growth_window_ms",
        "Growth rates (and so the time to exhaustion) are fitted over this window of recent probes (the\n\
         host's over at least 5 s: MemAvailable moves in steps).",
    ),
    (
        "host.process_root",
        "Root under which attached jobs' /proc/PID and their cgroups are read. \"/\" outside tests.",
    ),
    (
        "control",
        "The control socket (attach, pause, resume…) and the daemon's persistent state.",
    ),
    (
        "control.socket",
        "Unix socket for memwatch's commands. Any user may connect; the daemon checks the caller's uid\n\
         (SO_PEERCRED): root may act on any process, others only on their own.",
    ),
    (
        "control.state_dir",
        "Where what outlives a reboot is kept: the audit log (events.jsonl), the journal of config\n\
         changes and the records of emergency swap files.",
    ),
    (
        "control.runtime_dir",
        "Where the live state is kept: state.json (the attached jobs and the paused set, so that a\n\
         restarted daemon or the guardian resumes what was paused) and the daemon's lock. It describes\n\
         live processes only, so it belongs on a tmpfs: a pause's record written ahead of the pause never\n\
         waits there for a busy disk (a write of it that takes 10 ms or more is logged as a warning).\n\
         Unset (the default): \"state\" beside the control socket, here /run/memwatch/state, so one\n\
         daemon per socket is one per runtime directory.",
    ),
    (
        "control.audit_max_bytes",
        "The audit log is trimmed to its newer half when it grows past this size.",
    ),
    (
        "control.max_connections",
        "Most control-socket connections other users than root may have open at once (at most 4096).\n\
         Beyond it new ones are closed at once. Root has max_connections_per_uid of its own on top, so no\n\
         flood of other users' connections can lock root out.",
    ),
    (
        "control.max_connections_per_uid",
        "Most control-socket connections one user (uid) may hold open at once.",
    ),
    (
        "control.max_jobs_per_uid",
        "Most jobs one non-root user may have attached at once.",
    ),
    (
        "control.max_directives_per_job",
        "Config changes remembered per job; the oldest applied ones are dropped beyond this.",
    ),
    (
        "control.successor_grace_ms",
        "When the daemon dies, how long its guardian waits for a successor (a daemon restarted by\n\
         systemd, RestartSec=1) to take over the paused jobs before it resumes them itself (ms, at most\n\
         60000). A successor keeps a job paused for memory paused; without one, the jobs run again\n\
         this long after the death.",
    ),
    (
        "policy",
        "When memwatch pauses a job and when it resumes it. Levels per resource are ok / warn / critical,\n\
         with enter and leave thresholds and hold times so they do not flap. A [policy.X] table needs\n\
         only the keys it changes: the others keep that resource's defaults shown here.",
    ),
    ("policy.dry_run", "Decide and record, but send no signal."),
    (
        "policy.reflex",
        "Stop a job whose cgroup's unreclaimable memory reaches its critical line in the wake thread, with no\n\
         hop to the engine: on cgroup v1 when the kernel's threshold notification comes, on v2 by the\n\
         thread's own reads of memory.current (timed for 4 GiB/s of growth to be caught before it is\n\
         halfway from the line to the limit: every few ms next to the line, less often the farther the\n\
         job is from it). Armed ahead (recorded in the state file), fired at the crossing,\n\
         then taken over by the engine as its own pause. Off: the engine decides on its probe, as for\n\
         every other line.",
    ),
    (
        "policy.reflex_priority",
        "The real-time priority (SCHED_FIFO, 1-99) of the wake thread, which reads the kernel's\n\
         notifications and fires the reflexes, and of the firers (one pinned to each CPU, which fire a\n\
         v1 job's reflex from the CPU it grows on), so that they run the moment the kernel wakes them\n\
         even while the job they watch keeps every core busy; 0: the daemon's own priority. They sleep\n\
         but for those moments. Needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least this (the unit's\n\
         LimitRTPRIO=1); where the kernel refuses, the thread runs at the daemon's priority and the\n\
         log says so once.",
    ),
    (
        "policy.reaction_ms",
        "Pause when a job's memory is projected to hit its tightest limit (the host's MemAvailable, its\n\
         cgroup limit) sooner than this, whatever the levels say. It covers a probe interval plus the\n\
         signalling, with room to spare.",
    ),
    (
        "policy.resume_headroom_ms",
        "A job paused for fast growth is resumed only when the room left under the limit that was running\n\
         out would last this long (at least twice reaction_ms) at the rate it was growing when paused, or\n\
         faster where it is measured faster now. A paused job cannot grow: its growth while held resumes\n\
         nothing; room does (a raised limit, memory freed elsewhere).",
    ),
    (
        "policy.max_pause_seconds",
        "Longest pause. The default stays under PyTorch's 10-minute NCCL watchdog, which kills\n\
         distributed jobs whose ranks stop answering.",
    ),
    (
        "policy.allow_long_pause",
        "Allow max_pause_seconds above 540 (9 minutes). Off by default: a longer pause outlives PyTorch's\n\
         NCCL watchdog (10 minutes) and ends distributed jobs.",
    ),
    (
        "policy.on_max_pause",
        "What to do when a pause reaches max_pause_seconds: resume, stay or terminate (SIGTERM to every\n\
         process of the job, continued to act on it; SIGKILL 10 s later for what is left). A memory\n\
         pause the [way_out] ladder handled is never resumed into its shortfall: it is stopped (resume,\n\
         terminate) or stays (stay).",
    ),
    (
        "policy.checkpoint_signal",
        "Signal sent to a job's root process so that it saves a checkpoint (e.g. \"SIGUSR1\"): before a\n\
         pause when there is time for it, and by the way out's checkpoint step. Empty: none.",
    ),
    (
        "policy.checkpoint_grace_ms",
        "Time the job gets to checkpoint before it is paused.",
    ),
    (
        "adapt",
        "Rewrites of an attached job's training config (memwatch attach --config-file F --profile P),\n\
         applied by the trainer at its next epoch boundary.",
    ),
    (
        "adapt.grow",
        "Also make the reverse change (micro-batch up, accumulation down) after a long time with lots of\n\
         room. Off by default: growing is the user's choice.",
    ),
    (
        "adapt.grow_after_seconds",
        "How long every resource must have had lots of room before growing.",
    ),
    (
        "adapt.min_micro_batch",
        "Never rewrite the micro-batch below this.",
    ),
    (
        "adapt.max_micro_batch",
        "Never rewrite the micro-batch above this.",
    ),
    (
        "adapt.max_accumulation",
        "Never rewrite gradient accumulation above this.",
    ),
    (
        "adapt.min_workers",
        "Never rewrite DataLoader workers below this.",
    ),
    (
        "adapt.settle_seconds",
        "After the trainer applied a change, wait this long before the next one, so memory can settle\n\
         (PyTorch's caching allocator keeps what it reserved).",
    ),
    (
        "adapt.verify_seconds",
        "After the trainer acknowledged fewer DataLoader workers, the job's process count must fall (and\n\
         hold for a second with the new workers running) within this long; a micro-batch or accumulation\n\
         change must show in the trainer's `running` report within this long once it reports one. Else\n\
         the change is marked unverified (the trainer said so, the job does not show it).",
    ),
    (
        "way_out",
        "What memwatch does when a job paused for memory cannot go on: the room it needs does not come\n\
         back within `decide_seconds`. It goes down `steps` in order, skipping a step that cannot apply,\n\
         and records each step. A job no step helps is stopped at `policy.max_pause_seconds` (or stays\n\
         paused with `on_max_pause = \"stay\"`); it is never resumed into the same shortfall, but for one\n\
         a projection alone paused, below its critical line: that one is resumed once, and until its\n\
         level is back to ok or it has run for `policy.max_pause_seconds` only its critical line pauses\n\
         it again.",
    ),
    (
        "way_out.steps",
        "The ladder, in order. \"swap\": emergency swap sized to the shortfall, the job resumed to apply an\n\
         urgent fix (a trainer speaking the protocol); the swap is cleared once RAM can take it back.\n\
         A job no fix can help now has its held memory pushed out to swap instead, and is resumed into\n\
         that room.\n\
         \"lend\": the same with the job's own cgroup limit raised for a while (only where `lend` or\n\
         `memwatch launch --lend` allows). \"checkpoint\": ask for a checkpoint, then stop the whole job\n\
         cleanly (`memwatch launch` relaunches it with the adapted config). [] disables the ladder.",
    ),
    (
        "way_out.decide_seconds",
        "How long a memory pause may wait for room to come back by itself before the ladder starts.",
    ),
    (
        "way_out.fix_seconds",
        "How long a job resumed with emergency room gets to apply the urgent fix and fit again.",
    ),
    (
        "way_out.swap_margin_mib",
        "Emergency swap and lent memory are the shortfall plus this margin.",
    ),
    (
        "way_out.swap_max_mib",
        "Most emergency swap memwatch adds for one job (zram is also kept under half of MemAvailable).",
    ),
    (
        "way_out.zram",
        "Make emergency swap on a zram device where the kernel has zram (/sys/class/zram-control).",
    ),
    (
        "way_out.swapfile_dir",
        "Without zram: a directory on a local disk for an emergency swapfile (never tmpfs). Empty: none.",
    ),
    (
        "way_out.lend",
        "Allow the \"lend\" step for every job whose own cgroup memwatch can write (off: only jobs\n\
         started with `memwatch launch --lend`).",
    ),
    (
        "way_out.lend_max_mib",
        "Most memory lent to one job's cgroup; never more than the host can spare above its warn level.",
    ),
    (
        "way_out.checkpoint_grace_seconds",
        "After a checkpoint request, how long to wait for the trainer's acknowledgement (or its exit)\n\
         before the job is stopped.",
    ),
    (
        "notify",
        "Who is told when memwatch acts, and how. Each [[notify.channels]] entry has a `kind`:\n\
         \"webhook\" (POSTs the event as JSON to `url`), \"slack\" (POSTs {\"text\": …} to a Slack or\n\
         Mattermost incoming-webhook `url`), \"ntfy\" (POSTs the message to an ntfy topic `url` with\n\
         Title, Priority and Tags headers) or \"command\" (runs `command` = [\"/abs/program\", \"arg\", …]\n\
         with MEMWATCH_EVENT, MEMWATCH_JOB, MEMWATCH_SLURM_JOB_ID, MEMWATCH_REASON, MEMWATCH_DETAIL, MEMWATCH_MESSAGE,\n\
         MEMWATCH_HOST, MEMWATCH_TIMESTAMP_MS, MEMWATCH_DRY_RUN (1 or 0) and MEMWATCH_HELD_BACK set). Optional: `name` (logs and metrics use it, never\n\
         the URL), `token` (webhook, ntfy: sent as a Bearer token), `events` (default: all of pause,\n\
         resume, stop, restart, staged, applied, unverified, near_exhaustion, collector_down),\n\
         `min_interval_seconds` (300: the same event for the same job at most this often; the next says\n\
         how many were held back), `max_per_hour` (30), `retries` (3, backoff doubling from\n\
         `retry_base_ms`, 1000) and `timeout_seconds` (10). URLs and tokens are secrets: they are never\n\
         logged, shown in the API or printed by `memwatch config`. Delivery runs beside the daemon's\n\
         work and never delays a pause. Example:\n\
         [[notify.channels]]\n\
         kind = \"ntfy\"\n\
         url = \"https://ntfy.example.org/gpu-box-01\"\n\
         events = [\"pause\", \"stop\", \"near_exhaustion\"]",
    ),
    (
        "notify.near_exhaustion_seconds",
        "A running job that will reach a limit within this long at its current (sustained) growth\n\
         raises a near_exhaustion notification: once, and again only after the job has stayed more than\n\
         twice this far from every limit (or stopped growing) for this long without a break.",
    ),
    (
        "notify.channels",
        "The channels, each a [[notify.channels]] table (see `notify`). None by default.",
    ),
    (
        "slurm",
        "Slurm jobs followed by job id (`memwatch attach --slurm-job ID`, or the prolog in\n\
         deploy/slurm/). Running as root, memwatch may use scontrol; as another user, that user needs\n\
         Slurm's operator role (sacctmgr) or a sudoers line (docs/cluster.md).",
    ),
    (
        "slurm.job_wide_pause",
        "Pause a Slurm job through Slurm (`scontrol suspend`, later `scontrol resume`): every rank on\n\
         every node stops together, so no rank waits at a collective for a rank memwatch stopped.\n\
         Off, or when scontrol fails: stop only this node's tasks with signals.",
    ),
    (
        "slurm.requeue",
        "The way out's checkpoint step ends a Slurm job with `scontrol requeue` (it runs again from its\n\
         checkpoint when Slurm schedules it) instead of `scancel`.",
    ),
    (
        "slurm.scontrol",
        "The scontrol program: a name looked up in PATH, or an absolute path.",
    ),
    ("slurm.scancel", "The scancel program."),
    (
        "slurm.command_timeout_ms",
        "How long one scontrol or scancel may run before memwatch gives up on it (and falls back to\n\
         signals for a pause; a suspend or resume that timed out is first checked against the job's state,\n\
         `scontrol show job`, since a busy slurmctld may have carried it out). The daemon waits for it, so\n\
         keep it short.",
    ),
    (
        "slurm.adopt_within_seconds",
        "How long a job attached by id waits for its first process on this node (a prolog runs before\n\
         the tasks start) before memwatch forgets it; also how long it waits for the job's next step\n\
         here once its processes on this node all ended (until the epilog detaches it).",
    ),
    (
        "slurm.holds",
        "Keep each node's hold on a job's suspension in the job's AdminComment (`memwatch_hold=NODE@UNTIL`,\n\
         before the rest of the comment; only a Slurm administrator may set it): a node that has room\n\
         again resumes the job only once no other node still holds it, and a node that finds the job\n\
         running while it still needs the pause suspends it again. Off: any node's resume resumes the\n\
         whole job.",
    ),
    (
        "slurm.hold_seconds",
        "How long a node's hold counts unless its memwatch renews it (it does while it holds the job): a\n\
         node that dies holding a job holds it at most this long (10 to 86400).",
    ),
    (
        "slurm.node_name",
        "This node's Slurm node name, for its hold. Empty: the host name up to its first dot, which is\n\
         what slurmd uses unless it runs with -N or the node has a NodeHostname.",
    ),
    (
        "policy.*.action",
        "pause: pause the jobs the resource concerns; warn: record and report only.",
    ),
    ("policy.*.warn", "Enter warn at this ratio (0-1)."),
    ("policy.*.warn_leave", "Leave warn below this ratio."),
    ("policy.*.critical", "Enter critical at this ratio."),
    (
        "policy.*.critical_leave",
        "Leave critical below this ratio.",
    ),
    (
        "policy.*.enter_hold_ms",
        "How long a value must stay past an enter threshold before the level rises.",
    ),
    (
        "policy.*.leave_hold_ms",
        "How long a value must stay under a leave threshold before the level falls.",
    ),
    (
        "policy.*.warn_below_slowdown",
        "Warn this many °C below the slowdown point.",
    ),
    (
        "policy.*.critical_below_shutdown",
        "Critical (pause) this many °C below the shutdown point.",
    ),
    (
        "policy.*.resume_below_slowdown",
        "Leave critical (resume) this many °C below the slowdown point.",
    ),
    (
        "policy.*.fallback_slowdown_celsius",
        "Slowdown point when the device reports none.",
    ),
    (
        "policy.*.fallback_shutdown_celsius",
        "Shutdown point when the device reports none.",
    ),
];
