//! Estimates against DeepSpeed's own published numbers, and the notes' tiers.

use super::*;

const G: u64 = 1 << 30;

fn t5_3b() -> Model {
    // DeepSpeed's memory docs: t5-3b, "2851M total params, 32M largest layer params", 1 node, 8 GPUs.
    Model {
        params: 2851e6,
        layers: None,
        hidden: None,
        heads: None,
        seq_len: None,
        largest_layer_params: Some(32e6),
        gpus: 8,
    }
}

fn gb(b: f64) -> f64 {
    b / GIB
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= want * 0.03 + 0.01
}

#[test]
fn matches_deepspeeds_published_estimates() {
    let o = options(&t5_3b());
    // (option, DeepSpeed's per-CPU GB, per-GPU GB) from its docs' output tables.
    let want = [
        ("ZeRO-2 + CPU optimizer offload", 127.48, 5.31),
        ("ZeRO-2", 127.48, 15.93),
        ("ZeRO-3 + CPU offload (params and optimizer)", 71.71, 0.12),
        ("ZeRO-3 + CPU optimizer offload", 63.74, 0.79),
        ("ZeRO-3", 1.47, 6.10),
    ];
    for (name, cpu, gpu) in want {
        let x = o.iter().find(|x| x.name == name).unwrap();
        assert!(
            close(gb(x.cpu_bytes), cpu),
            "{name}: CPU {:.2} GB, DeepSpeed says {cpu}",
            gb(x.cpu_bytes)
        );
        assert!(
            close(gb(x.gpu_bytes), gpu),
            "{name}: GPU {:.2} GB, DeepSpeed says {gpu}",
            gb(x.gpu_bytes)
        );
    }
}

#[test]
fn the_notes_tiers() {
    assert_eq!(notes_tier(24_000_000_000).0, "> 12 GB: ZeRO-2");
    assert_eq!(notes_tier(8_000_000_000).3, 3);
    assert_eq!(notes_tier(5_000_000_000).4, 8);
    assert_eq!(
        notes_tier(3_000_000_000),
        ("< 4 GB: ZeRO-3 + CPU offload", 3, true, 1, 16, 1024)
    );
}

#[test]
fn activations_follow_korthikanti() {
    let m = Model {
        params: 1.5e9,
        layers: Some(48),
        hidden: Some(1600),
        heads: Some(25),
        seq_len: Some(1024),
        largest_layer_params: None,
        gpus: 1,
    };
    // s·b·h·(34 + 5·a·s/h) per layer: 1024·1·1600·(34 + 80) = 186,777,600 bytes; × 48 layers.
    assert_eq!(activations(&m, 1, false), Some(186_777_600.0 * 48.0));
    assert_eq!(
        activations(&m, 2, true),
        Some(2.0 * 1024.0 * 2.0 * 1600.0 * 48.0)
    );
}

fn machine(ram: u64, avail: u64, gpu_gb: u64, n: u32) -> Machine {
    Machine {
        ram_total_bytes: ram * G,
        ram_available_bytes: avail * G,
        swap_free_bytes: 0,
        gpus: (0..n)
            .map(|i| (i, "GPU".to_owned(), gpu_gb * G, gpu_gb * G))
            .collect(),
    }
}

#[test]
fn a_1_5b_model_on_small_gpus_needs_offload_and_checks_host_ram() {
    let model = |gpus| Model {
        params: 1.5e9,
        layers: Some(48),
        hidden: Some(1600),
        heads: Some(25),
        seq_len: Some(1024),
        largest_layer_params: None,
        gpus,
    };
    // Two 8 GiB GPUs, 64 GiB RAM: ZeRO-2 (4P + 8P = 18 GB) does not fit; optimizer offload (2P = 3 GB) does.
    let r = check(machine(64, 60, 8, 2), Some(model(2)));
    let o = r.recommendation.option.clone().unwrap();
    assert_eq!(o.name, "ZeRO-2 + CPU optimizer offload", "{r:#?}");
    assert!(
        r.recommendation
            .notes
            .iter()
            .any(|n| n.starts_with("CPU offload needs 33.5 GiB")),
        "{:?}",
        r.recommendation.notes
    );
    // The tier's effective batch (3 × 6 per GPU) is kept or exceeded.
    assert!(r.recommendation.micro_batch * r.recommendation.accumulation >= 18);
    // The same GPUs with 8 GiB of RAM available cannot take the offload (33.5 GiB), and ZeRO-3 over two
    // GPUs still needs 9P = 12.6 GiB each: nothing fits, and it says why.
    let r = check(machine(16, 8, 8, 2), Some(model(2)));
    assert_eq!(r.recommendation.option, None, "{r:#?}");
    assert!(
        r.recommendation
            .notes
            .iter()
            .any(|n| n.contains("host RAM cannot hold what offload moves there"))
    );
    assert!(
        r.recommendation
            .notes
            .iter()
            .any(|n| n.contains("num_workers 0"))
    );
    assert!(!r.recommendation.pin_memory);
    // Four such GPUs shard the states instead (18P/4 = 6.3 GiB each): ZeRO-3, no offload.
    let r = check(machine(16, 8, 8, 4), Some(model(4)));
    assert_eq!(
        r.recommendation.option.as_ref().map(|o| o.name),
        Some("ZeRO-3"),
        "{r:#?}"
    );
    // One 8 GiB GPU and 8 GiB of RAM: nothing fits; it says why.
    let r = check(machine(8, 6, 8, 1), Some(model(1)));
    assert_eq!(r.recommendation.option, None);
    assert!(
        r.recommendation
            .notes
            .iter()
            .any(|n| n.contains("host RAM cannot hold what offload moves there")),
        "{:?}",
        r.recommendation.notes
    );
}

#[test]
fn configs_are_ready_to_use() {
    let r = check(
        machine(64, 60, 24, 4),
        Some(Model {
            params: 7e8,
            layers: Some(24),
            hidden: Some(1536),
            heads: Some(16),
            seq_len: Some(2048),
            largest_layer_params: None,
            gpus: 4,
        }),
    );
    let ds = deepspeed_json(&r.recommendation, 4);
    let (b, a) = (
        ds["train_micro_batch_size_per_gpu"].as_u64().unwrap(),
        ds["gradient_accumulation_steps"].as_u64().unwrap(),
    );
    assert_eq!(
        ds["train_batch_size"].as_u64().unwrap(),
        b * a * 4,
        "DeepSpeed asserts train_batch = micro × accumulation × world"
    );
    let y = accelerate_yaml(&r.recommendation, 4);
    assert!(y.contains("num_processes: 4\n") && y.contains("distributed_type: DEEPSPEED\n"));
    assert!(crate::rewrite::parse(crate::rewrite::Format::Yaml, &y).is_ok());
}
