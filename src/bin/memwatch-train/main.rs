//! memwatch-train: a small GPT trained on CPU (CUDA when present) that memwatch adapts while it runs.
//!
//! The reference client of memwatch's protocol: it attaches itself with its config file, and at every
//! epoch boundary re-reads that file, asks for directives, applies them (rebuilding its batches) and
//! acknowledges. Between steps (at most every `POLL_EVERY`) it asks too: an urgent change is applied
//! at the next step (an optimizer step is an accumulation boundary, so micro × accumulation stays
//! exact), and a checkpoint request is answered with a checkpoint and an acknowledgement. It reports
//! progress, saves a checkpoint at each epoch end and on the checkpoint signal, and can resume from
//! one (`--resume`, or `MEMWATCH_RESUME=1` under `memwatch launch` when there is one). An
//! out-of-memory error inside a step costs that step, not the run (recover.rs): the trainer halves
//! its micro-batch, keeps the step exact, and tells memwatch. Built with `--features trainer` (needs
//! libtorch).
//!
//! `memwatch-train [--config memwatch-train.toml] [--resume] [--log-json FILE] [--no-memwatch]`

mod data;
mod link;
mod model;
mod recover;
mod settings;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use tch::{Device, nn, nn::OptimizerConfig};

use settings::Settings;

static CHECKPOINT_REQUESTED: AtomicBool = AtomicBool::new(false);

/// How often the trainer asks memwatch for urgent changes and checkpoint requests between steps.
const POLL_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

extern "C" fn on_checkpoint_signal(_: nix::libc::c_int) {
    CHECKPOINT_REQUESTED.store(true, Ordering::SeqCst);
}

struct Args {
    config: PathBuf,
    resume: bool,
    /// Resume when there is a checkpoint, start afresh when there is none.
    resume_if_any: bool,
    log_json: Option<PathBuf>,
    memwatch: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        config: PathBuf::from("memwatch-train.toml"),
        resume: false,
        resume_if_any: false,
        log_json: None,
        memwatch: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--config" => a.config = it.next().context("--config needs a path")?.into(),
            "--log-json" => a.log_json = Some(it.next().context("--log-json needs a path")?.into()),
            "--resume" => a.resume = true,
            "--no-memwatch" => a.memwatch = false,
            "-h" | "--help" => {
                println!(
                    "usage: memwatch-train [--config FILE] [--resume] [--log-json FILE] [--no-memwatch]"
                );
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?} (see --help)"),
        }
    }
    a.config = std::path::absolute(&a.config)?;
    // `memwatch launch` relaunches a stopped job with MEMWATCH_RESUME=1.
    a.resume_if_any = std::env::var("MEMWATCH_RESUME").is_ok_and(|v| v == "1");
    Ok(a)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CheckpointMeta {
    epoch: u64,
    generation: u64,
    /// Set when `epoch` is under way: the step to go on from (the weights are those before it).
    /// Without it, `epoch` is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    step: Option<u64>,
}

fn save(vs: &nn::VarStore, dir: &std::path::Path, meta: &CheckpointMeta) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join("latest.ot.tmp");
    vs.save(&tmp)?;
    std::fs::rename(&tmp, dir.join("latest.ot"))?;
    memwatch::act::persist::write_atomic(&dir.join("latest.json"), &serde_json::to_vec(meta)?)?;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("memwatch-train: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let a = args()?;
    let mut s = Settings::load(&a.config)?;
    let text = std::fs::read_to_string(&s.data.corpus)
        .with_context(|| format!("{}", s.data.corpus.display()))?;
    let corpus = data::Corpus::new(&text)?;
    let device = Device::cuda_if_available();
    tch::manual_seed(s.train.seed);
    let mut vs = nn::VarStore::new(device);
    let max_seq = s.train.seq_len.max(256);
    let gpt = model::Gpt::new(
        &vs.root(),
        corpus.vocab.len() as i64,
        s.model.embed,
        s.model.heads,
        s.model.layers,
        max_seq,
    );
    let mut opt = nn::AdamW::default().build(&vs, s.train.learning_rate)?;

    let mut link = a.memwatch.then(|| {
        link::Link::new(
            &s.memwatch.url,
            s.memwatch.socket.clone(),
            s.memwatch.name.clone(),
            a.config.clone(),
        )
    });
    if let Some(l) = link.as_mut() {
        l.register();
    }
    if let Some(sig) = memwatch::act::signal_by_name(&s.memwatch.checkpoint_signal) {
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(on_checkpoint_signal),
            nix::sys::signal::SaFlags::SA_RESTART,
            nix::sys::signal::SigSet::empty(),
        );
        // SAFETY: the handler only stores to an atomic.
        unsafe { nix::sys::signal::sigaction(sig, &action) }?;
    }
    let (mut start_epoch, mut start_step) = (0, 0);
    let latest = s.memwatch.checkpoint_dir.join("latest.json");
    if a.resume || (a.resume_if_any && latest.exists()) {
        let meta: CheckpointMeta = serde_json::from_slice(
            &std::fs::read(&latest).with_context(|| format!("{}", latest.display()))?,
        )
        .with_context(|| format!("{}", latest.display()))?;
        vs.load(s.memwatch.checkpoint_dir.join("latest.ot"))?;
        if let Some(l) = link.as_mut() {
            l.generation = meta.generation;
        }
        match meta.step {
            Some(step) => {
                (start_epoch, start_step) = (meta.epoch, step);
                eprintln!(
                    "memwatch-train: resumed at epoch {}, step {step}",
                    meta.epoch
                );
            }
            None => {
                start_epoch = meta.epoch + 1;
                eprintln!("memwatch-train: resumed after epoch {}", meta.epoch);
            }
        }
    }

    let (ex, ey) = corpus.eval_batch(64, s.train.seq_len, device);
    // Evaluated a micro-batch at a time, so that it fits where training does.
    let eval = |gpt: &model::Gpt, micro: i64| {
        tch::no_grad(|| gpt.f_eval(&ex, &ey, micro, device)).map_err(|e| {
            anyhow::anyhow!(
                "evaluating the model: {}",
                recover::first_line(&e.to_string())
            )
        })
    };
    let initial = eval(&gpt, s.train.micro_batch)?;
    println!("loss at start: {initial:.4}");
    if let Some(mib) = s.fault.as_ref().and_then(|f| f.address_space_headroom_mib) {
        let cap = recover::cap_address_space(mib)?;
        eprintln!(
            "memwatch-train: [fault] address space capped at {} MiB",
            cap >> 20
        );
    }
    let mut stepper = recover::Stepper::new(&gpt, device, s.fault.clone());
    // After an out-of-memory error, the largest micro-batch known to fit, kept for the rest of the run.
    let mut fits: Option<i64> = None;
    let mut log = Vec::new();
    for epoch in start_epoch..s.train.epochs {
        // --- epoch boundary: the only place the batch changes ---
        if let Some(l) = link.as_mut() {
            let staged = l.poll().staged;
            match Settings::load(&a.config) {
                Ok(fresh) => s.train = fresh.train,
                Err(e) => eprintln!("memwatch-train: keeping the current settings: {e:#}"),
            }
            if let Some(g) = staged {
                l.ack(g, epoch);
                eprintln!("memwatch-train: applied generation {g} at epoch {epoch}");
            }
        }
        let (mut micro, mut window, mut seq) = shape(&s.train, fits);
        let mut polled = Instant::now();
        println!(
            "epoch {epoch}: micro-batch {micro}, accumulation {} (effective {window}), seq_len {seq}",
            recover::accumulation(window, micro)
        );
        let t_epoch = Instant::now();
        let mut since = Instant::now();
        let mut last = 0.0;
        let first = if epoch == start_epoch { start_step } else { 0 };
        for step in first..s.train.steps_per_epoch {
            // Gradient accumulation by hand: zero, then backward per micro-batch, then one step. The
            // window's samples are drawn at once and cut into micro-batches (recover.rs).
            let (x, y) = corpus.batch(window, seq, device);
            let min_micro = s.train.min_micro_batch;
            let (mut ooms, mut floor) = (0, None);
            let outcome = stepper.window(&mut opt, &x, &y, &mut micro, min_micro, |o| {
                ooms += 1;
                let Some(after) = o.micro_after else {
                    floor = Some(o.clone());
                    return;
                };
                eprintln!(
                    "memwatch-train: out of memory in the {} pass at epoch {epoch}, step {step} (micro-batch {}): {}; going on at micro-batch {after}, accumulation {}{}",
                    o.phase.name(),
                    o.micro_before,
                    o.message,
                    recover::accumulation(window, after),
                    if o.phase == recover::Phase::Backward { ", from the step's first micro-batch" } else { "" },
                );
                if let Some(l) = link.as_mut() {
                    l.oom(&recover::report(o, epoch, step, window, min_micro, device, false));
                }
            })?;
            let total = match outcome {
                recover::Window::Done { loss } => loss,
                recover::Window::Floor => {
                    let g = link.as_ref().map(|l| l.generation).unwrap_or(0);
                    let meta = CheckpointMeta {
                        epoch,
                        generation: g,
                        step: Some(step),
                    };
                    let saved = save(&vs, &s.memwatch.checkpoint_dir, &meta);
                    if let (Some(o), Some(l)) = (&floor, link.as_mut()) {
                        let body = recover::report(
                            o,
                            epoch,
                            step,
                            window,
                            min_micro,
                            device,
                            saved.is_ok(),
                        );
                        l.oom(&body);
                    }
                    saved?;
                    write_log(a.log_json.as_deref(), initial, None, &log)?;
                    eprintln!(
                        "memwatch-train: out of memory at the smallest micro-batch ({min_micro}) at epoch {epoch}, step {step}: {}; checkpoint saved (resume goes on from this step); stopping",
                        floor.as_ref().map(|o| o.message.as_str()).unwrap_or("")
                    );
                    stop_for_relaunch();
                }
            };
            if ooms > 0 {
                fits = Some(micro);
            }
            opt.step();
            last = total;
            log.push(serde_json::json!({
                "epoch": epoch, "step": step, "micro": micro, "accum": recover::accumulation(window, micro),
                "loss": total, "oom": ooms,
                "t_ms": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
            }));
            let mut checkpoint_asked = false;
            if let Some(l) = link.as_mut().filter(|_| polled.elapsed() >= POLL_EVERY) {
                polled = Instant::now();
                let p = l.poll();
                checkpoint_asked = p.checkpoint;
                if let (Some(g), true) = (p.staged, p.urgent) {
                    // Urgent: the next step runs with the new values (this is an accumulation
                    // boundary: the optimizer just stepped).
                    match Settings::load(&a.config) {
                        Ok(fresh) => {
                            s.train = fresh.train;
                            (micro, window, seq) = shape(&s.train, fits);
                            l.ack(g, epoch);
                            eprintln!(
                                "memwatch-train: applied urgent generation {g} at epoch {epoch}, step {step}: micro-batch {micro}, accumulation {}",
                                recover::accumulation(window, micro)
                            );
                        }
                        Err(e) => eprintln!("memwatch-train: cannot apply generation {g}: {e:#}"),
                    }
                }
            }
            if CHECKPOINT_REQUESTED.swap(false, Ordering::SeqCst) || checkpoint_asked {
                let g = link.as_ref().map(|l| l.generation).unwrap_or(0);
                save(
                    &vs,
                    &s.memwatch.checkpoint_dir,
                    &CheckpointMeta {
                        epoch: epoch.saturating_sub(1),
                        generation: g,
                        step: None,
                    },
                )?;
                eprintln!("memwatch-train: checkpoint saved on request");
                if checkpoint_asked {
                    if let Some(l) = link.as_mut() {
                        l.checkpoint_saved();
                    }
                }
            }
            if (step + 1) % s.memwatch.progress_every.max(1) == 0 {
                let secs = since.elapsed().as_secs_f64().max(1e-9);
                let rate = (s.memwatch.progress_every * window as u64) as f64 / secs;
                since = Instant::now();
                if let Some(l) = link.as_mut() {
                    l.progress(&memwatch::adapt::Progress {
                        epoch,
                        step,
                        loss: Some(total),
                        samples_per_second: Some(rate),
                        timestamp_ms: 0,
                        running: Some(running(micro, recover::accumulation(window, micro), seq)),
                    });
                }
            }
        }
        let g = link.as_ref().map(|l| l.generation).unwrap_or(0);
        save(
            &vs,
            &s.memwatch.checkpoint_dir,
            &CheckpointMeta {
                epoch,
                generation: g,
                step: None,
            },
        )?;
        println!(
            "epoch {epoch} done in {:.1} s, last loss {last:.4}",
            t_epoch.elapsed().as_secs_f64()
        );
    }
    let fin = eval(
        &gpt,
        fits.map_or(s.train.micro_batch, |f| f.min(s.train.micro_batch)),
    )?;
    println!("loss at end: {fin:.4}");
    write_log(a.log_json.as_deref(), initial, Some(fin), &log)
}

/// `--log-json`: the losses at the start and the end (`null` for a run that stopped early) and every
/// step.
fn write_log(
    path: Option<&std::path::Path>,
    initial: f64,
    fin: Option<f64>,
    steps: &[serde_json::Value],
) -> anyhow::Result<()> {
    if let Some(path) = path {
        let out = serde_json::json!({ "initial_loss": initial, "final_loss": fin, "steps": steps });
        std::fs::write(path, serde_json::to_vec(&out)?)
            .with_context(|| format!("{}", path.display()))?;
    }
    Ok(())
}

/// The micro-batch, the window (micro-batch × accumulation: the samples per optimizer step) and the
/// sequence length to run with: the config's, the micro-batch no larger than what fits after an
/// out-of-memory error.
fn shape(t: &settings::Train, fits: Option<i64>) -> (i64, i64, i64) {
    let micro = fits.map_or(t.micro_batch, |f| t.micro_batch.min(f));
    (micro, t.micro_batch * t.accumulation, t.seq_len)
}

/// Ends the process by SIGTERM, as `memwatch launch` relaunches a job that a signal ended (a
/// non-zero exit is a job that failed on its own, not relaunched).
fn stop_for_relaunch() -> ! {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restores SIGTERM's default action (the checkpoint signal may be SIGTERM).
    let _ = unsafe { nix::sys::signal::sigaction(Signal::SIGTERM, &default) };
    let mut term = SigSet::empty();
    term.add(Signal::SIGTERM);
    let _ = term.thread_unblock();
    let _ = nix::sys::signal::raise(Signal::SIGTERM);
    std::process::exit(75)
}

/// What this trainer runs with now, as memwatch's knobs: the daemon checks it against the changes
/// it asked for.
fn running(
    micro: i64,
    accum: i64,
    seq: i64,
) -> std::collections::BTreeMap<memwatch::rewrite::profile::Knob, memwatch::rewrite::Scalar> {
    use memwatch::rewrite::{Scalar, profile::Knob};
    [
        (Knob::MicroBatch, Scalar::Int(micro)),
        (Knob::Accumulation, Scalar::Int(accum)),
        (Knob::SeqLen, Scalar::Int(seq)),
    ]
    .into_iter()
    .collect()
}
