use super::*;

const G: u64 = 1 << 30;

fn recovered() -> OomReport {
    OomReport {
        epoch: 2,
        step: 37,
        phase: "backward".into(),
        micro_batch_before: 32,
        recovered: true,
        micro_batch_after: Some(16),
        accumulation_after: Some(4),
        min_micro_batch: Some(1),
        checkpointed: false,
        requested_bytes: Some(2 * G),
        allocated_bytes: None,
        reserved_bytes: None,
        gpu_free_bytes: Some(G * 6 / 5),
        gpu_total_bytes: Some(80 * G),
        device: None,
        rank: None,
        world_size: None,
        snapshot: Some("/tmp/oom.pickle".into()),
        message: None,
    }
}

fn stopped() -> OomReport {
    OomReport {
        phase: "forward".into(),
        micro_batch_before: 1,
        recovered: false,
        micro_batch_after: None,
        accumulation_after: None,
        checkpointed: true,
        snapshot: None,
        ..recovered()
    }
}

#[test]
fn a_recovery_says_where_what_it_runs_with_now_and_the_allocators_figures() {
    let r = recovered().checked().unwrap();
    assert_eq!(
        r.describe(&Staging::ConfigFile, false),
        "CUDA OOM in the backward pass at epoch 2, step 37: recovered at micro-batch 16 × \
         accumulation 4 (was 32 × 2); tried to allocate 2.00 GiB with 1.20 GiB free of 80.00 GiB; \
         a CUDA memory snapshot was saved (its path: the job's cuda_oom.last); the new micro-batch \
         goes to its config file for the next start"
    );
    let public = r.clone().public();
    assert_eq!((public.snapshot, public.message), (None, None));
    let r = OomReport {
        device: Some(1),
        rank: Some(1),
        world_size: Some(4),
        allocated_bytes: Some(70 * G),
        reserved_bytes: Some(78 * G),
        snapshot: None,
        ..r
    };
    assert_eq!(
        r.describe(
            &Staging::Not("the job was attached without a config file".into()),
            false
        ),
        "CUDA OOM on GPU 1 (rank 1 of 4) in the backward pass at epoch 2, step 37: recovered at \
         micro-batch 16 × accumulation 4 (was 32 × 2); tried to allocate 2.00 GiB with 1.20 GiB \
         free of 80.00 GiB; PyTorch had 70.00 GiB allocated of 78.00 GiB reserved; not staged: the \
         job was attached without a config file"
    );
    // A halving that is not exact says only the micro-batch it came from.
    let odd = OomReport {
        micro_batch_before: 3,
        micro_batch_after: Some(1),
        accumulation_after: Some(2),
        ..recovered()
    };
    assert!(
        odd.describe(&Staging::None, false)
            .contains("recovered at micro-batch 1 × accumulation 2 (was micro-batch 3)"),
        "{}",
        odd.describe(&Staging::None, false)
    );
}

#[test]
fn a_stop_at_the_floor_says_whether_a_checkpoint_was_saved_and_who_relaunches() {
    let r = stopped().checked().unwrap();
    assert_eq!(
        r.describe(&Staging::None, true),
        "CUDA OOM in the forward pass at epoch 2, step 37 at the floor micro-batch 1 \
         (min_micro_batch 1): the trainer saved a checkpoint and stops; memwatch launch relaunches \
         it; tried to allocate 2.00 GiB with 1.20 GiB free of 80.00 GiB"
    );
    assert!(
        r.describe(&Staging::None, false)
            .contains("saved a checkpoint and stops; start it again to resume")
    );
    let bare = OomReport {
        checkpointed: false,
        min_micro_batch: None,
        requested_bytes: None,
        gpu_free_bytes: None,
        gpu_total_bytes: None,
        ..stopped()
    };
    assert_eq!(
        bare.describe(&Staging::None, true),
        "CUDA OOM in the forward pass at epoch 2, step 37 at the floor micro-batch 1: the trainer \
         stops without a checkpoint"
    );
    let mut counts = CudaOoms::default();
    counts.note(recovered(), 5);
    assert_eq!(counts.stopped_with_checkpoint(), None);
    counts.note(r, 9);
    assert_eq!((counts.recovered, counts.stopped), (1, 1));
    assert_eq!(
        counts.stopped_with_checkpoint().as_deref(),
        Some("CUDA OOM at its floor micro-batch 1; checkpoint saved")
    );
    counts.note(bare, 10);
    assert_eq!(
        counts.stopped_with_checkpoint(),
        None,
        "no checkpoint saved"
    );
}

#[test]
fn nonsense_is_refused_with_what_is_wrong() {
    let refused = |r: OomReport| r.checked().unwrap_err();
    let e = refused(OomReport {
        phase: "sideways".into(),
        ..recovered()
    });
    assert!(e.contains("phase") && e.contains("sideways"), "{e}");
    for after in [0, 32, 64] {
        let e = refused(OomReport {
            micro_batch_after: Some(after),
            ..recovered()
        });
        assert!(
            e.contains("micro_batch_after") && e.contains(&after.to_string()),
            "{e}"
        );
    }
    let e = refused(OomReport {
        micro_batch_after: None,
        ..recovered()
    });
    assert!(e.contains("needs micro_batch_after"), "{e}");
    let e = refused(OomReport {
        accumulation_after: Some(0),
        ..recovered()
    });
    assert!(e.contains("accumulation_after"), "{e}");
    let e = refused(OomReport {
        min_micro_batch: Some(24),
        ..recovered()
    });
    assert!(e.contains("min_micro_batch (24)"), "{e}");
    let e = refused(OomReport {
        micro_batch_before: 0,
        ..stopped()
    });
    assert!(e.contains("micro_batch_before"), "{e}");
    let e = refused(OomReport {
        allocated_bytes: Some(2 * G),
        reserved_bytes: Some(G),
        ..recovered()
    });
    assert!(e.contains("allocated_bytes"), "{e}");
    let e = refused(OomReport {
        gpu_free_bytes: Some(81 * G),
        ..recovered()
    });
    assert!(e.contains("gpu_free_bytes"), "{e}");
    let e = refused(OomReport {
        rank: Some(4),
        world_size: Some(4),
        ..recovered()
    });
    assert!(e.contains("rank 4"), "{e}");
}

#[test]
fn the_message_keeps_its_first_line_and_at_most_500_characters() {
    let r = OomReport {
        message: Some(format!("{}\nsecond line", "x".repeat(900))),
        ..stopped()
    }
    .checked()
    .unwrap();
    assert_eq!(r.message.as_deref(), Some("x".repeat(MAX_MESSAGE).as_str()));
    // A recovery keeps no checkpoint.
    let r = OomReport {
        checkpointed: true,
        ..recovered()
    }
    .checked()
    .unwrap();
    assert!(!r.checkpointed);
}

#[test]
fn fragmentation_is_a_cache_that_would_hold_the_request_and_a_fifth_of_what_is_reserved() {
    let with = |requested, allocated, reserved| OomReport {
        requested_bytes: Some(requested),
        allocated_bytes: Some(allocated),
        reserved_bytes: Some(reserved),
        ..recovered()
    };
    // 10 GiB cached of 70 reserved, 2 GiB asked: cache ≥ request, 70 ≥ 1.25 × 60 = 75? no.
    assert_eq!(with(2 * G, 60 * G, 70 * G).fragmentation(), None);
    // 20 GiB cached of 76: 76 ≥ 1.25 × 56 = 70, and 20 ≥ 2.
    let f = with(2 * G, 56 * G, 76 * G).fragmentation().unwrap();
    assert_eq!(f.cached(), 20 * G);
    // Exactly 1.25 × allocated counts; the request exactly the cache counts.
    assert!(with(G, 4 * G, 5 * G).fragmentation().is_some());
    assert!(with(G + 1, 4 * G, 5 * G).fragmentation().is_none());
    // A cache smaller than the request is no fragmentation: the GPU is simply full.
    assert_eq!(with(30 * G, 40 * G, 60 * G).fragmentation(), None);
    // Missing figures say nothing.
    assert_eq!(recovered().fragmentation(), None);
    assert_eq!(
        OomReport {
            requested_bytes: Some(0),
            ..with(0, 4 * G, 8 * G)
        }
        .fragmentation(),
        None
    );
}

#[test]
fn sizes_read_as_pytorch_writes_them() {
    assert_eq!(size(2 * G), "2.00 GiB");
    assert_eq!(size(512 << 20), "512.00 MiB");
    assert_eq!(size(1000), "1000 bytes");
    assert_eq!(size(1536), "1.50 KiB");
}

#[test]
fn a_stop_may_name_the_micro_batch_to_relaunch_at_and_it_is_checked_as_a_recovery_is() {
    let refused = |r: OomReport| r.checked().unwrap_err();
    // A DDP rank whose synced backward pass ran out at 8: it stops, to be relaunched at 4 × 4.
    let r = OomReport {
        micro_batch_before: 8,
        micro_batch_after: Some(4),
        accumulation_after: Some(4),
        ..stopped()
    }
    .checked()
    .unwrap();
    assert!(r.checkpointed && !r.recovered);
    let d = r.describe(&Staging::ConfigFile, true);
    assert!(
        d.contains("not recoverable in the step")
            && d.contains("relaunch runs at micro-batch 4 × accumulation 4"),
        "{d}"
    );
    let mut oom = CudaOoms::default();
    oom.note(r, 1);
    assert_eq!(
        oom.stopped_with_checkpoint().as_deref(),
        Some(
            "CUDA OOM at micro-batch 8 not recoverable in the step; checkpoint saved, relaunched at micro-batch 4"
        )
    );
    // Only one of the two, or a micro-batch not below the one that ran out, is refused.
    let e = refused(OomReport {
        micro_batch_before: 8,
        micro_batch_after: Some(4),
        ..stopped()
    });
    assert!(e.contains("accumulation_after"), "{e}");
    let e = refused(OomReport {
        micro_batch_before: 8,
        accumulation_after: Some(4),
        ..stopped()
    });
    assert!(e.contains("micro_batch_after"), "{e}");
    let e = refused(OomReport {
        micro_batch_before: 4,
        micro_batch_after: Some(4),
        accumulation_after: Some(4),
        ..stopped()
    });
    assert!(e.contains("below micro_batch_before"), "{e}");
}
