//! The Debian package: built by scripts/build-deb.sh (from the debug build, to save time), installed
//! with dpkg into a fresh root, where the installed binary answers `--version` and checks the config the
//! package put in /etc; then removed (the config stays, a conffile) and purged (nothing stays).

mod common;

use std::path::Path;
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dpkg(root: &Path, args: &[&str]) -> String {
    // No chroot for the maintainer scripts (the fresh root has no shell); they see DPKG_ROOT and
    // start nothing. The root has no libc6 package either: --force-depends.
    let mut cmd = Command::new("dpkg");
    cmd.arg(format!("--root={}", root.display()))
        .args([
            "--force-depends",
            "--force-script-chrootless",
            "--log=/dev/null",
        ])
        .args(args);
    run(&mut cmd)
}

#[test]
fn the_deb_installs_into_a_fresh_root_and_runs_from_it() {
    let built = run(Command::new(common::repo().join("scripts/build-deb.sh"))
        .arg("--debug")
        .current_dir(common::repo()));
    let deb = common::repo().join(built.lines().last().expect("the script names the .deb"));
    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    for path in [
        "./usr/bin/memwatch",
        "./lib/systemd/system/memwatch.service",
        "./etc/memwatch/memwatch.toml",
        "./usr/share/man/man1/memwatch.1.gz",
        "./usr/share/bash-completion/completions/memwatch",
        "./usr/share/zsh/vendor-completions/_memwatch",
        "./usr/share/fish/vendor_completions.d/memwatch.fish",
        "./usr/share/memwatch/slurm/memwatch-slurm.sh",
        "./usr/share/memwatch/slurm/prolog.sh -> memwatch-slurm.sh",
        "./usr/share/memwatch/slurm/epilog.sh -> memwatch-slurm.sh",
        "./usr/share/memwatch/dashboards/memwatch-cluster-grafana.json",
        "./usr/share/memwatch/dashboards/recording.yml",
    ] {
        assert!(
            contents.contains(path),
            "{path} not in the package:\n{contents}"
        );
    }
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
    ] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").unwrap();
    std::fs::write(r.join("var/lib/dpkg/available"), "").unwrap();
    dpkg(r, &["-i", deb.to_str().unwrap()]);
    let status = dpkg(r, &["-s", "memwatch"]);
    assert!(status.contains("Status: install ok installed"), "{status}");
    assert!(
        status.contains("/etc/memwatch/memwatch.toml"),
        "the config is a conffile: {status}"
    );
    let bin = r.join("usr/bin/memwatch");
    let version = run(Command::new(&bin).arg("--version"));
    assert_eq!(
        version.trim(),
        format!("memwatch {}", env!("CARGO_PKG_VERSION"))
    );
    let config = r.join("etc/memwatch/memwatch.toml");
    let checked = run(Command::new(&bin)
        .arg("--config")
        .arg(&config)
        .args(["config", "check"]));
    assert!(checked.contains("listen = \"127.0.0.1:9300\""), "{checked}");
    let unit = std::fs::read_to_string(r.join("lib/systemd/system/memwatch.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/memwatch --config /etc/memwatch/memwatch.toml run")
            && !unit.contains("/usr/local"),
        "{unit}"
    );
    let man = run(Command::new("gzip")
        .arg("-dc")
        .arg(r.join("usr/share/man/man1/memwatch.1.gz")));
    assert!(
        man.contains(".TH memwatch 1") && man.contains("status"),
        "{man}"
    );
    // Removed: the program goes, the edited config stays; purged: it goes too.
    std::fs::write(&config, "listen = \"127.0.0.1:9301\"\n").unwrap();
    dpkg(r, &["-r", "memwatch"]);
    assert!(!bin.exists());
    assert!(config.exists(), "remove keeps conffiles");
    dpkg(r, &["-P", "memwatch"]);
    assert!(!config.exists(), "purge removes them");
}
