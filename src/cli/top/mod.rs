//! `memwatch top`: a live terminal view of what the daemon sees, for people who work over ssh —
//! levels, RAM, swap, pressure and GPUs with sparklines, the processes on each GPU (user, command,
//! GPU and host memory, CPU), and the jobs with why and how long they are paused. Keys pause, resume
//! and detach the selected job through the control socket, with the caller's own rights.

mod draw;
mod model;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};

use crate::cli::status::JobLine;
use crate::control::Request;
use model::{Model, Source};

/// Seconds of history the sparklines show.
const HISTORY_SECONDS: u64 = 120;

/// Where to find the daemon, and how often to refresh.
pub struct Args {
    pub url: String,
    pub socket: PathBuf,
    pub interval: Duration,
}

/// Jobs in the order shown: paused first, then by name.
fn sorted_jobs(m: &Model) -> Vec<&JobLine> {
    let mut v: Vec<&JobLine> = m.overview.jobs.iter().collect();
    v.sort_by_key(|j| (j.pause.is_none(), j.name.clone()));
    v
}

/// `memwatch top`: checks its arguments and that it has a terminal, then runs.
pub(super) fn start(
    cli: &super::Cli,
    url: Option<String>,
    interval: f64,
    socket: &super::SocketArg,
) -> Result<(), super::Failure> {
    if !(0.1..=60.0).contains(&interval) {
        return Err(super::usage(anyhow::anyhow!(
            "--interval takes 0.1 to 60 seconds, got {interval}"
        )));
    }
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return Err(super::usage(anyhow::anyhow!(
            "memwatch top needs a terminal; use `memwatch status --watch` or `--json` otherwise"
        )));
    }
    let config = super::load_config(cli)?;
    run(&Args {
        url: url.unwrap_or_else(|| super::daemon_url(&config)),
        socket: socket.socket.clone().unwrap_or(config.control.socket),
        interval: Duration::from_secs_f64(interval),
    })?;
    Ok(())
}

/// Runs until `q`; the terminal is restored whatever happens.
pub fn run(a: &Args) -> anyhow::Result<()> {
    let mut terminal = ratatui::init();
    let result = event_loop(&mut terminal, a);
    ratatui::restore();
    result
}

fn event_loop(terminal: &mut ratatui::DefaultTerminal, a: &Args) -> anyhow::Result<()> {
    let mut source = Source::new(&a.url);
    let (mut model, mut error): (Option<Model>, Option<String>) = (None, None);
    let mut selected = 0usize;
    let mut message = String::new();
    // `d` asks first: a second `d` within 3 s detaches.
    let mut detach_armed: Option<(String, Instant)> = None;
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            match source.fetch(HISTORY_SECONDS) {
                Ok(m) => {
                    model = Some(m);
                    error = None;
                }
                Err(e) => error = Some(format!("{e:#}")),
            }
            next = Instant::now() + a.interval;
        }
        let jobs = model.as_ref().map_or(0, |m| m.overview.jobs.len());
        selected = selected.min(jobs.saturating_sub(1));
        terminal.draw(|f| {
            draw::frame(
                f,
                &draw::View {
                    model: model.as_ref(),
                    error: error.as_deref(),
                    url: &a.url,
                    selected,
                    message: &message,
                    now_ms: crate::clock::wall_ms(),
                },
            )
        })?;
        if !event::poll(next.saturating_duration_since(Instant::now()))? {
            continue;
        }
        let Event::Key(key) = event::read()? else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        let target = model
            .as_ref()
            .and_then(|m| sorted_jobs(m).get(selected).map(|j| j.name.clone()));
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
            KeyCode::Up | KeyCode::Char('k') => selected = selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => {
                selected = (selected + 1).min(jobs.saturating_sub(1))
            }
            KeyCode::Char(c @ ('p' | 'r' | 'd')) => {
                let Some(name) = target else {
                    message = "no job selected".into();
                    continue;
                };
                let request = match c {
                    'p' => Request::Pause {
                        target: name.clone(),
                    },
                    'r' => Request::Resume {
                        target: name.clone(),
                    },
                    _ => {
                        let armed = detach_armed.take().is_some_and(|(n, at)| {
                            n == name && at.elapsed() < Duration::from_secs(3)
                        });
                        if !armed {
                            message = format!("press d again to detach {name}");
                            detach_armed = Some((name, Instant::now()));
                            continue;
                        }
                        Request::Detach {
                            target: name.clone(),
                        }
                    }
                };
                message = act(&a.socket, &request, &name, c);
                next = Instant::now();
            }
            _ => {}
        }
    }
}

/// Sends one request over the control socket; the outcome in words.
fn act(socket: &Path, request: &Request, name: &str, key: char) -> String {
    let verb = match key {
        'p' => "paused",
        'r' => "resumed",
        _ => "detached",
    };
    match crate::control::client::call(socket, request) {
        Ok(r) if r.dry_run => format!("dry run: {name} was not {verb}"),
        Ok(_) => format!("{verb} {name}"),
        Err(e) => format!("{name}: {e:#}"),
    }
}
