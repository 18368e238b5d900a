//! Golden advice for the situations in the users' notes.

use super::*;
use crate::job::{JobSample, ProcessSample};
use crate::sample::cgroup::CgroupMemory;
use crate::sample::cgroup::Version;
use crate::sample::gpu::GpuSample;
use crate::sample::meminfo::MemInfo;

const G: u64 = 1 << 30;

fn gb(x: f64) -> u64 {
    (x * G as f64) as u64
}

fn gpu(index: u32, used: f64) -> GpuSample {
    GpuSample {
        index,
        memory_total_bytes: Some(gb(20.0)),
        memory_used_bytes: Some(gb(used)),
        temperature_celsius: Some(60.0),
        ..Default::default()
    }
}

fn proc(pid: u32, name: &str, pss: f64) -> ProcessSample {
    ProcessSample {
        pid,
        ppid: if pid == 100 { 1 } else { 100 },
        name: name.into(),
        state: "S".into(),
        rss_bytes: gb(pss * 2.0),
        pss_bytes: gb(pss),
        pss_read_ms: Some(0),
        rss_at_pss_read: gb(pss * 2.0),
        swap_bytes: 0,
        gpu_bytes: None,
    }
}

/// A job as the tests hold it: its name and its measurement.
struct Job {
    name: String,
    sample: Option<JobSample>,
}

fn job(processes: Vec<ProcessSample>) -> Job {
    Job {
        name: "t5".into(),
        sample: Some(JobSample {
            timestamp_ms: 0,
            rss_bytes: processes.iter().map(|p| p.rss_bytes).sum(),
            pss_bytes: processes.iter().map(|p| p.pss_bytes).sum(),
            pss_read_ms: Some(0),
            swap_bytes: 0,
            cgroup: None,
            gpu_bytes: None,
            gpus: None,
            process_count: processes.len(),
            processes,
        }),
    }
}

/// What advice sees of `jobs`, as the engine hands it over.
fn seen(jobs: &[Job]) -> Vec<JobSeen<'_>> {
    jobs.iter()
        .map(|j| JobSeen {
            name: &j.name,
            sample: j.sample.as_ref(),
            cgroup: j.sample.as_ref().and_then(|s| s.cgroup.as_ref()),
        })
        .collect()
}

/// Note 001: RAM 30.8/32 GB (1.4 GB available), swap 2.1/4 GB, three 20 GB GPUs at 46–57 %,
/// batch 32, accumulation 2, 7 workers, pin_memory on.
fn note_001() -> (Sample, Vec<Job>, Vec<(String, Knobs)>) {
    let sample = Sample {
        host: crate::sample::HostSample {
            memory: Some(MemInfo {
                total_bytes: gb(32.0),
                available_bytes: gb(1.4),
                free_bytes: gb(0.5),
                swap_total_bytes: gb(4.0),
                swap_free_bytes: gb(4.0 - 2.1),
                ..Default::default()
            }),
            page_size_bytes: 4096,
            ..Default::default()
        },
        gpus: vec![gpu(0, 9.6), gpu(1, 11.8), gpu(2, 9.3)],
        ..Default::default()
    };
    let mut procs = vec![proc(100, "python", 12.0)];
    for i in 0..7 {
        procs.push(proc(101 + i, "pt_data_worker", 0.5));
    }
    let knobs = Knobs {
        micro_batch: Some(32),
        accumulation: Some(2),
        workers: Some(7),
        pin_memory: Some(true),
        seq_len: None,
        world_size: Some(3),
        reported: vec![],
    };
    (sample, vec![job(procs)], vec![("t5".into(), knobs)])
}

/// The levels the policy would hold for this sample at its default thresholds (host RAM warn at
/// 80 %, critical at 95 %; GPU memory 90 % and 97 %; a job's cgroup 80 % and 95 %), held long
/// enough to have entered.
fn levels(sample: &Sample, jobs: &[Job]) -> BTreeMap<Resource, LevelState> {
    let level = |v: f64, warn: f64, crit: f64| LevelState {
        level: if v >= crit {
            Level::Critical
        } else if v >= warn {
            Level::Warn
        } else {
            Level::Ok
        },
        pending: None,
        value: Some(v),
        since_ms: 0,
        known: true,
    };
    let mut out = BTreeMap::new();
    if let Some(m) = &sample.host.memory {
        let used = 1.0 - m.available_bytes as f64 / m.total_bytes as f64;
        out.insert(Resource::HostMemory, level(used, 0.80, 0.95));
    }
    for g in &sample.gpus {
        if let Some(r) = gpu_ratio(g) {
            out.insert(Resource::GpuMemory(g.index), level(r, 0.90, 0.97));
        }
    }
    for j in jobs {
        let Some(c) = j.sample.as_ref().and_then(|s| s.cgroup.as_ref()) else {
            continue;
        };
        if let Some(l) = c.limit_bytes {
            let r = c.working_set_bytes() as f64 / l as f64;
            out.insert(Resource::JobCgroup(j.name.clone()), level(r, 0.80, 0.95));
        }
    }
    out
}

fn ids(a: &[Advice]) -> Vec<&str> {
    a.iter().map(|a| a.id.as_str()).collect()
}

#[test]
fn note_001_golden() {
    let (sample, jobs, knobs) = note_001();
    let a = advise(&Input {
        sample: &sample,
        previous: None,
        jobs: &seen(&jobs),
        knobs: &knobs,
        thermal_pauses: &[],
        levels: &levels(&sample, &jobs),
    });
    assert_eq!(
        ids(&a),
        vec![
            "pin-memory:t5",
            "swap-keep",
            "workers:t5",
            "keep-batch:t5",
            "stream-dataset:t5"
        ],
        "{a:#?}"
    );
    let get = |id: &str| a.iter().find(|x| x.id == id).unwrap();
    let w = get("workers:t5");
    assert_eq!(
        w.change,
        "num_workers 7 → 0 (in steps if data loading becomes the bottleneck)"
    );
    assert_eq!(
        w.evidence
            .iter()
            .filter(|e| e.starts_with("worker pid "))
            .count(),
        7
    );
    assert!(
        w.evidence
            .iter()
            .any(|e| e == "worker pid 101 (pt_data_worker): 512 MiB PSS, 1024 MiB RSS"),
        "{:?}",
        w.evidence
    );
    assert!(w.saving.as_deref().unwrap().starts_with("about 3.5 GiB"));
    assert_eq!(get("pin-memory:t5").change, "pin_memory=True → False");
    let keep = get("keep-batch:t5");
    assert!(
        keep.change
            .starts_with("keep micro-batch 32 and gradient accumulation 2"),
        "{}",
        keep.change
    );
    assert!(keep.change.contains("would not save host RAM"));
    // RAM cannot take 2.1 GiB of swap back with 1.4 GiB available: no swapoff.
    let swap = get("swap-keep");
    assert!(swap.title.contains("do not run swapoff"), "{}", swap.title);
    assert!(
        swap.change.contains("free at least 3.9 GiB"),
        "{}",
        swap.change
    );
    // No GPU advice: the GPUs have room.
    assert!(!a.iter().any(|x| x.id.starts_with("gpu-")));
}

#[test]
fn swap_clear_when_ram_can_take_it() {
    let (mut sample, _, _) = note_001();
    if let Some(m) = sample.host.memory.as_mut() {
        m.available_bytes = gb(20.0);
    }
    let a = advise(&Input {
        sample: &sample,
        previous: None,
        jobs: &[],
        knobs: &[],
        thermal_pauses: &[],
        levels: &levels(&sample, &[]),
    });
    assert_eq!(ids(&a), vec!["swap-clear"]);
    assert_eq!(a[0].change, "sudo swapoff -a && sudo swapon -a");
    assert!(
        a[0].saving.as_deref().unwrap().contains("about 11 s"),
        "{:?}",
        a[0].saving
    );
}

#[test]
fn swap_thrash_from_vmstat_rates() {
    let (mut prev, _, _) = note_001();
    prev.host.vmstat = Some(crate::sample::vmstat::VmStat {
        pswpin: 0,
        pswpout: 0,
        pgmajfault: 0,
        oom_kill: None,
    });
    let mut now = prev.clone();
    now.timestamp_ms = 1000;
    now.host.vmstat = Some(crate::sample::vmstat::VmStat {
        pswpin: 5000,
        pswpout: 5000,
        pgmajfault: 0,
        oom_kill: None,
    });
    let a = advise(&Input {
        sample: &now,
        previous: Some(&prev),
        jobs: &[],
        knobs: &[],
        thermal_pauses: &[],
        levels: &levels(&now, &[]),
    });
    assert_eq!(a[0].id, "swap-thrash");
    assert!(
        a[0].evidence.iter().any(|e| e.contains("in 19.5 MiB/s")),
        "{:?}",
        a[0].evidence
    );
}

#[test]
fn full_gpu_halves_the_micro_batch_keeping_the_effective_batch() {
    let (mut sample, jobs, knobs) = note_001();
    sample.host.memory.as_mut().unwrap().available_bytes = gb(20.0);
    sample.host.memory.as_mut().unwrap().swap_free_bytes = gb(4.0);
    sample.gpus[1].memory_used_bytes = Some(gb(19.5));
    let a = advise(&Input {
        sample: &sample,
        previous: None,
        jobs: &seen(&jobs),
        knobs: &knobs,
        thermal_pauses: &[],
        levels: &levels(&sample, &jobs),
    });
    let b = a.iter().find(|x| x.id == "gpu-batch:t5:1").unwrap();
    assert_eq!(b.severity, Severity::Critical);
    assert_eq!(
        b.change,
        "micro-batch 32 → 16, gradient accumulation 2 → 4: the effective batch stays 192"
    );
    let t = a
        .iter()
        .find(|x| x.id == "gpu-memory-techniques:1")
        .unwrap();
    assert!(
        t.change
            .contains("only if host RAM can take it (20.0 GiB available now)"),
        "{}",
        t.change
    );
    assert_eq!(smaller_divisor(3), 1);
    assert_eq!(smaller_divisor(12), 6);
}

/// Seen on a real H200 (scripts/gpu-check.sh): GPU memory back at 30 % while its level is held
/// critical for `leave_hold_ms`. The advice follows the value's level (`pending`), not the hold:
/// nothing to shrink at ok, and a warn while the value points to warn.
#[test]
fn a_level_held_only_by_its_leave_hold_advises_at_the_values_level() {
    let (mut sample, jobs, knobs) = note_001();
    sample.gpus[1].memory_used_bytes = Some(gb(19.5));
    let mut held = levels(&sample, &jobs);
    let gpu = Resource::GpuMemory(1);
    assert_eq!(held[&gpu].level, Level::Critical);
    let ask = |levels: &BTreeMap<Resource, LevelState>| {
        advise(&Input {
            sample: &sample,
            previous: None,
            jobs: &seen(&jobs),
            knobs: &knobs,
            thermal_pauses: &[],
            levels,
        })
    };
    // Back down, the level still critical: no batch advice, no techniques.
    held.get_mut(&gpu).unwrap().value = Some(0.30);
    held.get_mut(&gpu).unwrap().pending = Some((Level::Ok, 1000));
    let a = ask(&held);
    assert!(
        !a.iter()
            .any(|x| x.id == "gpu-batch:t5:1" || x.id == "gpu-memory-techniques:1"),
        "{a:?}"
    );
    // Pointing to warn: advised at warn, and said so.
    held.get_mut(&gpu).unwrap().value = Some(0.92);
    held.get_mut(&gpu).unwrap().pending = Some((Level::Warn, 1000));
    let a = ask(&held);
    let b = a.iter().find(|x| x.id == "gpu-batch:t5:1").unwrap();
    assert_eq!(b.severity, Severity::Warn);
    assert!(
        b.evidence[0].contains("is at warn: 92 % used"),
        "{:?}",
        b.evidence
    );
    // Entering a higher level is not advised before the policy enters it.
    held.get_mut(&gpu).unwrap().level = Level::Ok;
    held.get_mut(&gpu).unwrap().pending = Some((Level::Critical, 1000));
    assert!(!ask(&held).iter().any(|x| x.id == "gpu-batch:t5:1"));
}

#[test]
fn hot_gpu_gets_a_power_cap_and_repeated_pauses_are_flagged() {
    let (mut sample, _, _) = note_001();
    sample.host.memory.as_mut().unwrap().swap_free_bytes = gb(4.0);
    sample.host.memory.as_mut().unwrap().available_bytes = gb(20.0);
    sample.gpus[0].temperature_celsius = Some(88.0);
    sample.gpus[0].temperature_slowdown_celsius = Some(87.0);
    sample.gpus[0].power_limit_watts = Some(300.0);
    let a = advise(&Input {
        sample: &sample,
        previous: None,
        jobs: &[],
        knobs: &[],
        thermal_pauses: &[("t5".into(), 3)],
        levels: &levels(&sample, &[]),
    });
    assert_eq!(ids(&a), vec!["gpu-power-cap:0", "thermal-pauses:t5"]);
    assert!(
        a[0].change.starts_with("sudo nvidia-smi -i 0 -pl 240"),
        "{}",
        a[0].change
    );
}

/// A job whose cgroup is at 86 % on a roomy host: the advice cites the cgroup, its level and its
/// numbers (not host RAM), and what the trainer reports running with (not the file).
#[test]
fn cgroup_advice_cites_the_cgroup_and_what_runs() {
    let (mut sample, mut jobs, mut knobs) = note_001();
    if let Some(m) = sample.host.memory.as_mut() {
        m.available_bytes = gb(27.0);
        m.swap_free_bytes = m.swap_total_bytes;
    }
    let s = jobs[0].sample.as_mut().unwrap();
    s.timestamp_ms = 9_000;
    s.pss_read_ms = Some(5_000);
    s.cgroup = Some(CgroupMemory {
        version: Version::V2,
        path: "/train.slice/t5".into(),
        usage_bytes: gb(17.5),
        limit_bytes: Some(gb(20.0)),
        limit_source: None,
        oom_kills: Some(0),
        inactive_file_bytes: Some(gb(0.3)),
        active_file_bytes: None,
        dirty_bytes: None,
        anon_bytes: Some(gb(16.0)),
        file_bytes: Some(gb(1.5)),
    });
    // The file still says 7 workers and pin_memory on; the trainer runs 3 workers with it on.
    knobs[0].1.workers = Some(3);
    knobs[0].1.reported = vec![Knob::Workers, Knob::PinMemory];
    let lv = levels(&sample, &jobs);
    let run = |knobs: &[(String, Knobs)], levels: &BTreeMap<Resource, LevelState>| {
        advise(&Input {
            sample: &sample,
            previous: None,
            jobs: &seen(&jobs),
            knobs,
            thermal_pauses: &[],
            levels,
        })
    };
    let a = run(&knobs, &lv);
    let get = |id: &str| a.iter().find(|x| x.id == id).unwrap();
    let pin = get("pin-memory:t5");
    assert_eq!(
        pin.evidence,
        vec![
            "the job's memory cgroup /train.slice/t5 is at warn: 86 % used (17.2 GiB of 20.0 GiB, clean page cache aside)",
            "pin_memory on (the trainer reports running with it)",
        ]
    );
    let w = get("workers:t5");
    assert!(
        w.title.contains("short of its memory cgroup"),
        "{}",
        w.title
    );
    assert_eq!(
        w.change,
        "num_workers 3 → 0 (in steps if data loading becomes the bottleneck)"
    );
    assert!(
        w.evidence
            .contains(&"the trainer reports 3 DataLoader worker(s) running".to_owned())
    );
    assert!(
        !w.evidence.iter().any(|e| e.contains("host RAM")),
        "{:?}",
        w.evidence
    );
    let d = get("stream-dataset:t5");
    assert!(
        d.evidence
            .iter()
            .any(|e| e.ends_with("PSS (read 4 s before this sample)")),
        "{:?}",
        d.evidence
    );
    assert!(
        d.evidence
            .contains(&"17.5 GiB charged to its cgroup (anonymous and file pages)".to_owned())
    );
    // The trainer reports pin_memory off: no advice to turn it off, whatever the file says.
    knobs[0].1.pin_memory = Some(false);
    let a = run(&knobs, &lv);
    assert!(!a.iter().any(|x| x.id == "pin-memory:t5"), "{a:#?}");
    // Without a report, the file's value is cited as the file's.
    knobs[0].1.pin_memory = Some(true);
    knobs[0].1.reported.clear();
    let a = run(&knobs, &lv);
    let pin = a.iter().find(|x| x.id == "pin-memory:t5").unwrap();
    assert_eq!(
        pin.evidence[1],
        "pin_memory on (the config file; the trainer has not reported what it runs with)"
    );
    // Below warn nothing is raised, however full the numbers look to a fixed threshold.
    let mut lv = lv.clone();
    lv.get_mut(&Resource::JobCgroup("t5".into())).unwrap().level = Level::Ok;
    let a = run(&knobs, &lv);
    assert!(!a.iter().any(|x| x.job.is_some()), "{a:#?}");
}

#[test]
fn severity_names_are_the_serialized_ones() {
    for s in [Severity::Info, Severity::Warn, Severity::Critical] {
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
}

/// A hot NVMe drive is advised as the drive's cooling, not as CPU load; a hot CPU as before.
#[test]
fn a_hot_drive_is_advised_as_its_own_cooling_and_a_hot_cpu_as_cpu_load() {
    let (mut sample, _, _) = note_001();
    let sensor = |chip: &str, celsius: f64, cpu: bool| crate::sample::thermal::TempSensor {
        chip: chip.into(),
        sensor: "temp1".into(),
        celsius,
        max_celsius: None,
        crit_celsius: Some(80.0),
        cpu,
    };
    sample.host.temperatures = vec![sensor("nvme", 78.0, false), sensor("coretemp", 76.0, true)];
    let a = advise(&Input {
        sample: &sample,
        previous: None,
        jobs: &[],
        knobs: &[],
        thermal_pauses: &[],
        levels: &levels(&sample, &[]),
    });
    let drive = a
        .iter()
        .find(|x| x.id == "sensor-temperature:nvme:temp1")
        .unwrap();
    assert!(
        drive.change.contains("cooling of nvme") && !drive.change.contains("DataLoader"),
        "{}",
        drive.change
    );
    let cpu = a
        .iter()
        .find(|x| x.id == "cpu-temperature:coretemp:temp1")
        .unwrap();
    assert!(cpu.change.contains("DataLoader"), "{}", cpu.change);
}
