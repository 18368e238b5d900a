//! A real terminal for tests: a private tmux server running one command in a window of a given
//! size, read back with `capture-pane` (escapes kept) and driven with `send-keys`.

use std::process::Command;
use std::time::{Duration, Instant};

pub struct Tmux {
    socket: String,
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Tmux {
    /// Starts `command` (run through `env`, so it may begin with VAR=value words) in a detached
    /// `width`×`height` window with TERM=xterm-256color. The window stays after the command exits.
    pub fn start(width: u16, height: u16, command: &[&str]) -> Tmux {
        let socket = format!(
            "memwatch-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let t = Tmux { socket };
        let mut args = vec![
            "new-session".to_owned(),
            "-d".into(),
            "-x".into(),
            width.to_string(),
            "-y".into(),
            height.to_string(),
            "env".into(),
            "TERM=xterm-256color".into(),
        ];
        args.extend(command.iter().map(|s| s.to_string()));
        let ok = t.tmux().args(&args).status().expect("run tmux");
        assert!(ok.success(), "tmux new-session failed");
        t
    }

    fn tmux(&self) -> Command {
        // The server's config: the window stays when the command exits, so short commands
        // (`memwatch status`) can be read back.
        let conf = std::env::temp_dir().join("memwatch-test-tmux.conf");
        if !conf.exists() {
            std::fs::write(&conf, "set -g remain-on-exit on\nset -g status off\n")
                .expect("write the tmux config");
        }
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket, "-f"]).arg(conf);
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.tmux().args(args).output().expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The screen now, with colour escapes.
    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-e", "-t", "0"])
    }

    /// The screen as plain text.
    pub fn text(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "0"])
    }

    /// Waits up to 15 s for `needle` to show on the screen (plain text), and returns the screen
    /// with escapes.
    pub fn wait_for(&self, needle: &str) -> String {
        let start = Instant::now();
        loop {
            if self.text().contains(needle) {
                return self.screen();
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "{needle:?} never showed; the screen:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends keys as tmux names them ("q", "Down", "C-c").
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        self.run(&args);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").status();
    }
}
