//! When nothing fits: the blocker named is the real one, and every "would fit" passes the table's check.

use super::nothing_fits::{self, Blocker, Diagnosis, Fix};
use super::*;

/// Qwen2.5-7B's config.json, as far as `check` reads it.
const QWEN_7B: &str = r#"{"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "intermediate_size": 18944, "max_position_embeddings": 32768, "tie_word_embeddings": false}"#;

fn machine_gib(ram_available: f64, gpu_gib: u64, n: u32) -> Machine {
    Machine {
        ram_total_bytes: (ram_available * GIB) as u64,
        ram_available_bytes: (ram_available * GIB) as u64,
        swap_free_bytes: 0,
        gpus: (0..n)
            .map(|i| (i, "GPU".to_owned(), gpu_gib << 30, gpu_gib << 30))
            .collect(),
    }
}

/// The model as `memwatch check --model-config` builds it from a config.json.
fn from_config(text: &str, gpus_per_node: u64, nodes: u64) -> Model {
    let s = model_config::parse(text, "config.json").unwrap();
    Model {
        params: s.params,
        layers: Some(s.layers),
        hidden: Some(s.hidden),
        heads: Some(s.heads),
        seq_len: s.max_seq,
        largest_layer_params: Some(s.largest_layer),
        gpus_per_node,
        nodes,
    }
}

fn shaped_1_5b(gpus_per_node: u64) -> Model {
    Model {
        params: 1.5e9,
        layers: Some(48),
        hidden: Some(1600),
        heads: Some(25),
        seq_len: Some(1024),
        largest_layer_params: None,
        gpus_per_node,
        nodes: 1,
    }
}

/// Nothing fits `machine`, and every fix, run again through the whole `check`, fits with the layout it
/// names; every "would fit" note is one of those fixes. Returns the fixes and the notes.
fn nothing_fits_but_every_fix_holds(machine: &Machine, model: &Model) -> (Vec<Fix>, Vec<String>) {
    let r = check(machine.clone(), Some(model.clone()));
    assert_eq!(r.recommendation.fits, Some(false), "{r:#?}");
    let fixes = nothing_fits::fixes(machine, model, &r.verdicts);
    for f in &fixes {
        let again = check(f.machine.clone(), Some(f.model.clone()));
        assert_eq!(again.recommendation.fits, Some(true), "{}", f.change);
        assert_eq!(
            again.recommendation.option.as_ref(),
            Some(&f.verdict.option),
            "{}",
            f.change
        );
    }
    let notes = r.recommendation.notes;
    for n in notes.iter().filter(|n| n.contains("would fit")) {
        assert!(
            fixes.iter().any(|f| &f.note() == n),
            "a claim not checked: {n}"
        );
    }
    (fixes, notes)
}

fn fix<'a>(fixes: &'a [Fix], starts: &str) -> &'a Fix {
    fixes
        .iter()
        .find(|f| f.change.starts_with(starts))
        .unwrap_or_else(|| panic!("no fix {starts:?} in {fixes:#?}"))
}

#[test]
fn qwen_7b_on_8_big_gpus_is_short_of_host_ram_at_load() {
    let machine = machine_gib(23.5, 80, 8);
    let model = from_config(QWEN_7B, 8, 1);
    let r = check(machine.clone(), Some(model.clone()));
    // The table: ZeRO-3 without offload fits the GPUs; nothing fits host RAM.
    let zero3 = r.verdicts.iter().find(|v| v.option.name == "ZeRO-3");
    assert_eq!(
        zero3.map(|v| (v.fits_gpu, v.fits_ram)),
        Some((Some(true), false))
    );
    assert!(r.verdicts.iter().all(|v| !v.fits_ram));
    assert_eq!(
        nothing_fits::diagnose(&r.verdicts),
        Diagnosis {
            no_offload: Blocker::RamAtLoad,
            offload: Blocker::RamOffload
        }
    );
    let (fixes, notes) = nothing_fits_but_every_fix_holds(&machine, &model);
    let all = notes.join("\n");
    assert!(
        notes[0].starts_with(
            "nothing fits, and host RAM at load is the blocker, not GPU memory: ZeRO-3 fits the GPUs without offload"
        ),
        "{all}"
    );
    assert!(
        all.contains("each of the 8 local ranks loads the model"),
        "{all}"
    );
    assert!(!all.contains("only with CPU offload"), "{all}");
    // More RAM: the least that fits, to the 0.1 GiB --ram-gib takes.
    let ram = fix(&fixes, "with --ram-gib 24.4 ");
    assert_eq!(ram.verdict.option.name, "ZeRO-3");
    let less = Machine {
        ram_available_bytes: (24.3 * GIB) as u64,
        ..machine.clone()
    };
    assert!(first_fit(&judge(&less, &model)).is_none());
    // Fewer GPUs per node: the most that fit.
    let fewer = fix(&fixes, "on 7 GPU(s) per node (--gpus 7");
    assert_eq!(fewer.model.gpus_per_node, 7);
    assert!(fewer.verdict.option.cpu_bytes <= machine.ram_available_bytes as f64);
    // Or the same 8 GPUs over two nodes.
    let spread = fix(&fixes, "on the same 8 GPUs as 2 nodes × 4");
    assert_eq!((spread.model.nodes, spread.model.gpus_per_node), (2, 4));
    // A smaller model, with the RAM counted: the bound is the largest the check passes.
    let small = fixes
        .iter()
        .find(|f| f.model.params < model.params)
        .expect("a smaller model");
    let above = Model {
        params: small.model.params * 1.01,
        ..model.clone()
    };
    assert!(first_fit(&judge(&machine, &above)).is_none());
    // No more-GPUs claim: the GPUs are not what is short.
    assert!(
        !fixes.iter().any(|f| f.model.total_gpus() > 8),
        "{fixes:#?}"
    );
}

#[test]
fn gpu_memory_is_named_when_it_is_the_blocker() {
    // A 300M-parameter layer on a 1 GiB GPU: no layout fits the GPU, whatever the RAM.
    let model = Model {
        params: 1.5e9,
        layers: None,
        hidden: None,
        heads: None,
        seq_len: None,
        largest_layer_params: Some(300e6),
        gpus_per_node: 1,
        nodes: 1,
    };
    let machine = machine_gib(512.0, 1, 1);
    let r = check(machine.clone(), Some(model.clone()));
    assert_eq!(
        nothing_fits::diagnose(&r.verdicts).main(),
        Blocker::GpuMemory
    );
    let (fixes, notes) = nothing_fits_but_every_fix_holds(&machine, &model);
    let all = notes.join("\n");
    assert!(all.contains("GPU memory is the blocker"), "{all}");
    assert!(all.contains("NVMe"), "{all}");
    assert!(
        !all.contains("host RAM at load") && !all.contains("--ram-gib"),
        "{all}"
    );
    assert!(fixes.iter().all(|f| f.machine == machine), "{fixes:#?}");

    // 1.5B on one 24 GiB GPU with 21 GiB of RAM: without offload the GPU is short (host RAM at load
    // would do); more GPUs fix that, and the fewest that pass both checks are named.
    let model = Model {
        largest_layer_params: Some(131e6),
        ..model
    };
    let machine = machine_gib(21.0, 24, 1);
    let r = check(machine.clone(), Some(model.clone()));
    let d = nothing_fits::diagnose(&r.verdicts);
    assert_eq!(d.no_offload, Blocker::GpuMemory);
    assert!(
        r.verdicts
            .iter()
            .filter(|v| !v.option.offload_optimizer)
            .all(|v| v.fits_ram && v.fits_gpu == Some(false))
    );
    let (fixes, notes) = nothing_fits_but_every_fix_holds(&machine, &model);
    let more = fix(&fixes, "on 2 GPUs of this size (--gpus 2 --nodes 1)");
    assert_eq!(more.verdict.option.name, "ZeRO-2");
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("ZeRO-2 would fit on 2 GPUs"))
    );
    assert!(!notes.join("\n").contains("host RAM at load"));
}

#[test]
fn offload_with_enough_ram_is_named_when_it_is_the_fix() {
    // Two 8 GiB GPUs, 8 GiB of RAM: without offload the GPUs are short; ZeRO-2 with optimizer offload
    // fits them and needs 33.5 GiB of host RAM.
    let machine = machine_gib(8.0, 8, 2);
    let model = shaped_1_5b(2);
    let r = check(machine.clone(), Some(model.clone()));
    assert_eq!(
        nothing_fits::diagnose(&r.verdicts),
        Diagnosis {
            no_offload: Blocker::GpuMemory,
            offload: Blocker::RamOffload
        }
    );
    let (fixes, notes) = nothing_fits_but_every_fix_holds(&machine, &model);
    let all = notes.join("\n");
    assert!(
        all.contains(
            "the model fits the GPUs only with CPU offload (without it, even ZeRO-3 needs"
        ),
        "{all}"
    );
    assert!(
        all.contains("host RAM cannot hold what offload moves there"),
        "{all}"
    );
    let ram = fix(&fixes, "with --ram-gib 33.6 ");
    assert_eq!(ram.verdict.option.name, "ZeRO-2 + CPU optimizer offload");
    assert!(ram.verdict.option.offload_optimizer);
    let less = Machine {
        ram_available_bytes: (33.5 * GIB) as u64,
        ..machine.clone()
    };
    assert!(first_fit(&judge(&less, &model)).is_none());
    // Sharding over more GPUs is the other way: four such GPUs fit ZeRO-3 without offload.
    let more = fix(&fixes, "on 4 GPUs of this size");
    assert_eq!(more.verdict.option.name, "ZeRO-3");
}

#[test]
fn the_parameter_bound_is_the_checks_own() {
    // 1.5B on one 24 GiB GPU with 21 GiB of RAM: the largest model of this shape that fits.
    let model = shaped_1_5b(1);
    let machine = machine_gib(21.0, 24, 1);
    let (fixes, _) = nothing_fits_but_every_fix_holds(&machine, &model);
    let small = fixes
        .iter()
        .find(|f| f.model.params < model.params)
        .expect("a smaller model");
    let printed = format!("{:.2e}", small.model.params);
    assert!(
        small
            .change
            .contains(&format!("at most {printed} parameters"))
    );
    // The printed bound is what the check passes, and one step of its last digit above it is not.
    let p: f64 = printed.parse().unwrap();
    let at = |params| Model {
        params,
        ..model.clone()
    };
    assert!(first_fit(&judge(&machine, &at(p))).is_some());
    let step = 10f64.powi(p.log10().floor() as i32 - 2);
    assert!(first_fit(&judge(&machine, &at(p + step))).is_none());
}
