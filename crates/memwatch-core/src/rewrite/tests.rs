//! The rewriters, one finding at a time.
use super::*;

const JSON: &str = r#"{
  // not valid JSON, so not here
}"#;

#[test]
fn json_keeps_everything_else() {
    let text = "{\n  \"train_micro_batch_size_per_gpu\": 32,\n  \"gradient_accumulation_steps\":2 ,\n  \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"none\"}},\n  \"list\": [1, 2.50, \"x\"],\n  \"fp16\": {\"enabled\": true}\n}\n";
    let out = apply(
        Format::Json,
        text,
        &[
            ("train_micro_batch_size_per_gpu".into(), Scalar::Int(16)),
            ("gradient_accumulation_steps".into(), Scalar::Int(4)),
        ],
    )
    .unwrap();
    assert_eq!(out, text.replace(": 32,", ": 16,").replace(":2 ,", ":4 ,"));
    assert_eq!(
        get(Format::Json, &out, "zero_optimization.stage").unwrap(),
        Some(Scalar::Int(2))
    );
    assert!(apply(Format::Json, text, &[("nope".into(), Scalar::Int(1))]).is_err());
    assert!(parse(Format::Json, JSON).is_err());
}

#[test]
fn yaml_keeps_comments_and_layout() {
    let text = "# accelerate config\ncompute_environment: LOCAL_MACHINE\ndeepspeed_config:\n  gradient_accumulation_steps: 4   # tuned by hand\n  zero_stage: 2\nper_device_train_batch_size: 8\ndataloader_pin_memory: true\nlist:\n  - 1\n  - two\n";
    let out = apply(
        Format::Yaml,
        text,
        &[
            (
                "deepspeed_config.gradient_accumulation_steps".into(),
                Scalar::Int(8),
            ),
            ("per_device_train_batch_size".into(), Scalar::Int(4)),
            ("dataloader_pin_memory".into(), Scalar::Bool(false)),
        ],
    )
    .unwrap();
    assert_eq!(
        out,
        text.replace("steps: 4   #", "steps: 8   #")
            .replace("size: 8", "size: 4")
            .replace("memory: true", "memory: false")
    );
}

#[test]
fn toml_keeps_comments_and_layout() {
    let text = "# trainer\n[train]\nbatch_size = 32 # per device\naccum = 2\n\n[data]\nworkers = 8\npin_memory = true\n";
    let out = apply(
        Format::Toml,
        text,
        &[
            ("train.batch_size".into(), Scalar::Int(16)),
            ("data.pin_memory".into(), Scalar::Bool(false)),
        ],
    )
    .unwrap();
    assert_eq!(
        out,
        text.replace("= 32 #", "= 16 #")
            .replace("= true", "= false")
    );
}

#[test]
fn unparsable_files_are_refused() {
    assert!(
        apply(
            Format::Json,
            "{\"a\": 1,,}",
            &[("a".into(), Scalar::Int(2))]
        )
        .is_err()
    );
    assert!(
        apply(
            Format::Yaml,
            "a: [1, 2\nb: 3\n",
            &[("b".into(), Scalar::Int(2))]
        )
        .is_err()
    );
    assert!(apply(Format::Toml, "a = = 1", &[("a".into(), Scalar::Int(2))]).is_err());
}

fn set(format: Format, text: &str, path: &str, v: Scalar) -> Result<String, ContentError> {
    apply(format, text, &[(path.into(), v)])
}

#[test]
fn ambiguous_paths_are_refused() {
    // A key holding a dot beside the nested key it looks like.
    let j = r#"{"train": {"micro_batch": 32}, "train.micro_batch": {}}"#;
    let e = set(Format::Json, j, "train.micro_batch", Scalar::Int(16)).unwrap_err();
    assert_eq!(
        e,
        ContentError::Ambiguous {
            path: "train.micro_batch".into()
        }
    );
    assert!(e.to_string().contains("more than one"), "{e}");
    // Duplicate keys.
    let e = set(Format::Json, r#"{"a": 1, "a": 2}"#, "a", Scalar::Int(3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than one"), "{e}");
    // YAML null key beside the string "~".
    let y = "~: keep\n\"~\": 2\n";
    let e = set(Format::Yaml, y, "~", Scalar::Int(3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than one"), "{e}");
    // TOML: a quoted key with a dot beside a dotted key.
    let t = "\"a.b\" = 1\n[a]\nb = 2\n";
    let e = set(Format::Toml, t, "a.b", Scalar::Int(3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than one"), "{e}");
    // Unambiguous keys holding a dot are fine.
    let out = set(Format::Json, r#"{"a.b": 1}"#, "a.b", Scalar::Int(3)).unwrap();
    assert_eq!(out, r#"{"a.b": 3}"#);
}

#[test]
fn whole_number_floats_stay_floats() {
    assert_eq!(
        set(Format::Json, r#"{"lr": 0.1}"#, "lr", Scalar::parse("2.0")).unwrap(),
        r#"{"lr": 2.0}"#
    );
    assert_eq!(
        set(Format::Yaml, "lr: 0.1\n", "lr", Scalar::parse("2.0")).unwrap(),
        "lr: 2.0\n"
    );
    assert_eq!(
        set(Format::Toml, "lr = 0.1\n", "lr", Scalar::parse("2.0")).unwrap(),
        "lr = 2.0\n"
    );
    assert_eq!(
        set(Format::Yaml, "lr: 0.1\n", "lr", Scalar::parse("1e-5")).unwrap(),
        "lr: 1.0e-5\n"
    );
    assert!(
        set(
            Format::Json,
            r#"{"lr": 0.1}"#,
            "lr",
            Scalar::Float(f64::NAN)
        )
        .is_err()
    );
}

#[test]
fn a_yaml_alias_bomb_is_refused_in_bounded_memory() {
    // The classic "billion laughs": nine levels of nine aliases each.
    let y = include_str!("../../../../tests/fixtures/alias-bomb.yaml");
    assert!(y.len() < 600, "{}", y.len());
    let started = std::time::Instant::now();
    let e = parse(Format::Yaml, y).unwrap_err();
    assert_eq!(
        e,
        ContentError::NotAccepted {
            format: Format::Yaml,
            why: Box::new(ContentError::TooManyValues {
                through_aliases: true
            }),
        }
    );
    let e = e.to_string();
    assert!(
        e.contains("more than 100000 values") && e.contains("aliases"),
        "{e}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // A few honest aliases still read, as copies that cannot be edited in place.
    let ok = "base: &b {lr: 0.1}\nrun: *b\n";
    assert_eq!(
        get(Format::Yaml, ok, "run.lr").unwrap(),
        Some(Scalar::Float(0.1))
    );
    let e = set(Format::Yaml, ok, "run.lr", Scalar::Float(0.2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("edit it by hand"), "{e}");
    // Editing the anchored original would change its copy too: refused.
    let e = set(Format::Yaml, ok, "base.lr", Scalar::Float(0.2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("edit it by hand") || e.contains("also change"),
        "{e}"
    );
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    let deep = |open: &str, close: &str, n: usize| format!("{}{}", open.repeat(n), close.repeat(n));
    assert!(parse(Format::Json, &deep("[", "]", 100_000)).is_err());
    assert!(parse(Format::Yaml, &deep("[", "]", 100_000)).is_err());
    assert!(parse(Format::Toml, &format!("a = {}", deep("[", "]", 100_000))).is_err());
    let dotted = format!("{} = 1\n", vec!["a"; 50_000].join("."));
    assert!(parse(Format::Toml, &dotted).is_err());
    let many = format!("[{}0]", "0,".repeat(200_000));
    let e = parse(Format::Json, &many).unwrap_err().to_string();
    assert!(e.contains("more than 100000"), "{e}");
}

#[test]
fn yaml_edits_quoted_flow_and_unicode_values_in_place() {
    let y =
        "name: \"Grüße\"  # greeting\nopt: {lr: 0.1, wd: 0.01}\nlist: [1, 2]\ntag: 'it''s'\nü: 3\n";
    let out = apply(
        Format::Yaml,
        y,
        &[
            ("name".into(), Scalar::Str("x # y".into())),
            ("opt.wd".into(), Scalar::Float(0.5)),
            ("list.1".into(), Scalar::Int(7)),
            ("tag".into(), Scalar::Str("ok".into())),
            ("ü".into(), Scalar::Int(4)),
        ],
    )
    .unwrap();
    assert_eq!(
        out,
        "name: \"x # y\"  # greeting\nopt: {lr: 0.1, wd: 0.5}\nlist: [1, 7]\ntag: \"ok\"\nü: 4\n"
    );
    // Block scalars and multi-line values are not edited in place.
    let e = set(
        Format::Yaml,
        "s: |\n  a\n  b\n",
        "s",
        Scalar::Str("c".into()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("edit it by hand"), "{e}");
}

#[test]
fn toml_edits_only_the_value_text() {
    let t = "a.b = 1 # dotted\n[t]\ns = 'lit'\nx = [1, 2]\ninline = { k = 3 }\n";
    let out = apply(
        Format::Toml,
        t,
        &[
            ("a.b".into(), Scalar::Int(2)),
            ("t.s".into(), Scalar::Str("q\"".into())),
            ("t.x.0".into(), Scalar::Int(9)),
            ("t.inline.k".into(), Scalar::Int(4)),
        ],
    )
    .unwrap();
    assert_eq!(
        out,
        "a.b = 2 # dotted\n[t]\ns = 'q\"'\nx = [9, 2]\ninline = { k = 4 }\n"
    );
}

#[test]
fn an_edit_through_a_duplicated_key_is_refused() {
    // Found by the property run: the path is unique, but it runs through the first of two "a" keys,
    // which JSON parsers drop (they keep the last): the edit would land where nobody reads.
    let text = "{\"a\": [[false]], \"a\": [{}]}";
    let e = set(Format::Json, text, "a.0.0", Scalar::Bool(true)).unwrap_err();
    assert_eq!(
        e,
        ContentError::DuplicateKey {
            path: "a.0.0".into(),
            key: "a".into()
        }
    );
    assert!(e.to_string().contains("appears more than once"), "{e}");
    let yaml = "run: {lr: 0.1}\nrun: {batch: 2}\n";
    assert!(set(Format::Yaml, yaml, "run.lr", Scalar::Float(0.2)).is_err());
}

#[test]
fn a_profile_says_which_key_it_refuses_and_why() {
    use profile::Profile;
    let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        Profile::build("nonsense", &[]).unwrap_err(),
        ProfileError::Unknown("nonsense".into())
    );
    assert_eq!(
        Profile::build("hf", &keys(&["batch"])).unwrap_err(),
        ProfileError::NoEquals("batch".into())
    );
    assert_eq!(
        Profile::build("hf", &keys(&["lr=opt.lr"])).unwrap_err(),
        ProfileError::UnknownKnob("lr=opt.lr".into())
    );
    assert_eq!(
        Profile::build("hf", &keys(&["batch="])).unwrap_err(),
        ProfileError::EmptyPath("batch=".into())
    );
    assert_eq!(
        Profile::build("generic", &[]).unwrap_err(),
        ProfileError::NoKnobs
    );
    let p = Profile::build("generic", &keys(&["batch=train.bs"])).unwrap();
    assert_eq!(p.keys.len(), 1);
    // Shown to people with the key as given.
    assert_eq!(
        ProfileError::EmptyPath("batch=".into()).to_string(),
        "--key \"batch=\": empty path"
    );
}
