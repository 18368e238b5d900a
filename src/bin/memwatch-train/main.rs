//! memwatch-train: a small GPT trained on CPU (CUDA when present) that memwatch adapts while it runs.
//!
//! The reference client of memwatch's protocol: it attaches itself with its config file, and at every
//! epoch boundary re-reads that file, asks for directives, applies them (rebuilding its batches) and
//! acknowledges. Between steps (at most every `POLL_EVERY`) it asks too: an urgent change is applied
//! at the next step (an optimizer step is an accumulation boundary, so micro × accumulation stays
//! exact), and a checkpoint request is answered with a checkpoint and an acknowledgement. It reports
//! progress, saves a checkpoint at each epoch end and on the checkpoint signal, and can resume from
//! one. Built with `--features trainer` (needs libtorch).
//!
//! `memwatch-train [--config memwatch-train.toml] [--resume] [--log-json FILE] [--no-memwatch]`

mod data;
mod link;
mod model;
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
    log_json: Option<PathBuf>,
    memwatch: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        config: PathBuf::from("memwatch-train.toml"),
        resume: false,
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
    Ok(a)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CheckpointMeta {
    epoch: u64,
    generation: u64,
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
    let mut start_epoch = 0;
    if a.resume {
        let meta: CheckpointMeta = serde_json::from_slice(&std::fs::read(
            s.memwatch.checkpoint_dir.join("latest.json"),
        )?)?;
        vs.load(s.memwatch.checkpoint_dir.join("latest.ot"))?;
        start_epoch = meta.epoch + 1;
        if let Some(l) = link.as_mut() {
            l.generation = meta.generation;
        }
        eprintln!("memwatch-train: resumed after epoch {}", meta.epoch);
    }

    let (ex, ey) = corpus.eval_batch(64, s.train.seq_len, device);
    let eval = |gpt: &model::Gpt| tch::no_grad(|| gpt.loss(&ex, &ey, device).double_value(&[]));
    let initial = eval(&gpt);
    println!("loss at start: {initial:.4}");
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
        let (mut micro, mut accum, mut seq) =
            (s.train.micro_batch, s.train.accumulation, s.train.seq_len);
        let mut polled = Instant::now();
        println!(
            "epoch {epoch}: micro-batch {micro}, accumulation {accum} (effective {}), seq_len {seq}",
            micro * accum
        );
        let t_epoch = Instant::now();
        let mut window = Instant::now();
        let mut last = 0.0;
        for step in 0..s.train.steps_per_epoch {
            // Gradient accumulation by hand: zero, then backward per micro-batch, then one step.
            opt.zero_grad();
            let mut total = 0.0;
            for _ in 0..accum {
                let (x, y) = corpus.batch(micro, seq, device);
                let loss = gpt.loss(&x, &y, device) / accum as f64;
                loss.backward();
                total += loss.double_value(&[]);
            }
            opt.step();
            last = total;
            log.push(serde_json::json!({
                "epoch": epoch, "step": step, "micro": micro, "accum": accum, "loss": total,
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
                            (micro, accum, seq) =
                                (s.train.micro_batch, s.train.accumulation, s.train.seq_len);
                            l.ack(g, epoch);
                            eprintln!(
                                "memwatch-train: applied urgent generation {g} at epoch {epoch}, step {step}: micro-batch {micro}, accumulation {accum}"
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
                let secs = window.elapsed().as_secs_f64().max(1e-9);
                let rate = (s.memwatch.progress_every * (micro * accum) as u64) as f64 / secs;
                window = Instant::now();
                if let Some(l) = link.as_mut() {
                    l.progress(&memwatch::adapt::Progress {
                        epoch,
                        step,
                        loss: Some(total),
                        samples_per_second: Some(rate),
                        timestamp_ms: 0,
                        running: Some(running(micro, accum, seq)),
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
            },
        )?;
        println!(
            "epoch {epoch} done in {:.1} s, last loss {last:.4}",
            t_epoch.elapsed().as_secs_f64()
        );
    }
    let fin = eval(&gpt);
    println!("loss at end: {fin:.4}");
    if let Some(path) = a.log_json {
        let out = serde_json::json!({ "initial_loss": initial, "final_loss": fin, "steps": log });
        std::fs::write(&path, serde_json::to_vec(&out)?)?;
    }
    Ok(())
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
