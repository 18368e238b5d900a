//! Drawing one frame of `memwatch top`: levels, RAM, swap, pressure and each GPU with sparklines, the
//! GPU processes, the jobs (selectable), and a line of keys and the last action's outcome.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState, Wrap};

use super::model::Model;
use crate::human::{self, bytes};
use crate::policy::{Level, Resource};

/// What the frame needs besides the model.
pub struct View<'a> {
    pub model: Option<&'a Model>,
    pub error: Option<&'a str>,
    pub url: &'a str,
    pub selected: usize,
    pub message: &'a str,
    pub now_ms: u64,
}

fn colour(level: Level) -> Style {
    match level {
        Level::Critical => Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        Level::Warn => Style::default().fg(Color::Yellow),
        Level::Ok => Style::default().fg(Color::Green),
    }
}

/// The newest `width` values as block characters, scaled to `max`.
pub fn spark(values: &[f64], max: f64, width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let start = values.len().saturating_sub(width);
    values[start..]
        .iter()
        .map(|v| {
            let r = if max > 0.0 {
                (v / max).clamp(0.0, 1.0)
            } else {
                0.0
            };
            BARS[((r * 7.0).round() as usize).min(7)]
        })
        .collect()
}

fn level_of(m: &Model, key: &Resource) -> Level {
    m.overview
        .levels
        .iter()
        .find(|l| l.resource == *key)
        .map_or(Level::Ok, |l| l.level)
}

pub fn frame(f: &mut Frame, v: &View) {
    let area = f.area();
    let Some(m) = v.model else {
        let text = format!(
            "memwatch top ({}): {}\n\nq quits",
            v.url,
            v.error.unwrap_or("connecting…")
        );
        f.render_widget(Paragraph::new(text).wrap(Wrap { trim: false }), area);
        return;
    };
    let gpus = m.sample.gpus.len() as u16;
    let procs = (m.processes.len() as u16).min(6);
    let [head, levels, mem, gpu, proc_area, jobs_area, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(2),
        Constraint::Length(3),
        Constraint::Length(gpus.max(1)),
        Constraint::Length(if procs == 0 { 0 } else { procs + 1 }),
        Constraint::Min(2),
        Constraint::Length(1),
    ])
    .areas(area);
    let host = m.sample.host.hostname.as_deref().unwrap_or("this machine");
    let age = v.now_ms.saturating_sub(m.sample.timestamp_ms) as f64 / 1000.0;
    let dry = if m.overview.dry_run {
        " · DRY RUN"
    } else {
        ""
    };
    let mut title = vec![
        Span::styled(
            "memwatch top",
            Style::default().add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!(
            " · {host} · {} · sample {} old{dry}",
            v.url,
            human::duration(age)
        )),
    ];
    // The last refresh failed: what is shown is old, and says so.
    if let Some(e) = v.error {
        title.push(Span::styled(format!(" · {e}"), colour(Level::Critical)));
    }
    f.render_widget(Paragraph::new(Line::from(title)), head);
    f.render_widget(
        Paragraph::new(level_line(m, v.now_ms)).wrap(Wrap { trim: true }),
        levels,
    );
    f.render_widget(Paragraph::new(memory_lines(m, mem.width as usize)), mem);
    f.render_widget(Paragraph::new(gpu_lines(m, gpu.width as usize)), gpu);
    if procs > 0 {
        f.render_widget(process_table(m), proc_area);
    }
    let mut state = TableState::default().with_selected(Some(v.selected));
    f.render_stateful_widget(job_table(m, v.now_ms), jobs_area, &mut state);
    f.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(
                "q quit  ↑↓ select  p pause  r resume  d detach",
                Style::default().add_modifier(Modifier::REVERSED),
            ),
            Span::raw(format!("  {}", v.message)),
        ])),
        foot,
    );
}

fn level_line(m: &Model, now_ms: u64) -> Line<'static> {
    let mut spans = Vec::new();
    for level in [Level::Critical, Level::Warn] {
        for l in m.overview.levels.iter().filter(|l| l.level == level) {
            spans.push(Span::styled(
                format!(
                    "{} {}{} ({}{}) ",
                    level.as_str().to_uppercase(),
                    l.resource.words(),
                    l.resource.value_words(l.value),
                    human::duration(now_ms.saturating_sub(l.since_ms) as f64 / 1000.0),
                    // Back under its line, held by its leave hold (`memwatch status` says to what).
                    if l.settling.is_some() {
                        ", leaving"
                    } else {
                        ""
                    }
                ),
                colour(level),
            ));
        }
    }
    if spans.is_empty() {
        spans.push(Span::styled("all ok", colour(Level::Ok)));
    }
    Line::from(spans)
}

fn memory_lines(m: &Model, width: usize) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let Some(mem) = &m.sample.host.memory else {
        return vec![Line::raw("memory: unavailable (see the daemon's log)")];
    };
    let used = mem.total_bytes.saturating_sub(mem.available_bytes);
    let text = format!(
        "RAM  {:>6} / {:<6} {:>3.0}%  avail {:<6} ",
        bytes(used),
        bytes(mem.total_bytes),
        used as f64 * 100.0 / mem.total_bytes.max(1) as f64,
        bytes(mem.available_bytes)
    );
    let series: Vec<f64> = m
        .history
        .iter()
        .filter_map(|p| {
            Some(
                p.memory_total_bytes?
                    .saturating_sub(p.memory_available_bytes?) as f64,
            )
        })
        .collect();
    let room = width.saturating_sub(text.chars().count());
    out.push(Line::from(vec![
        Span::styled(text, colour(level_of(m, &Resource::HostMemory))),
        Span::raw(spark(&series, mem.total_bytes as f64, room)),
    ]));
    if mem.swap_total_bytes == 0 {
        out.push(Line::raw("Swap none"));
    } else {
        let text = format!(
            "Swap {:>6} / {:<6} {:>3.0}%  ",
            bytes(mem.swap_used_bytes()),
            bytes(mem.swap_total_bytes),
            mem.swap_used_bytes() as f64 * 100.0 / mem.swap_total_bytes as f64
        );
        let series: Vec<f64> = m
            .history
            .iter()
            .filter_map(|p| p.swap_used_bytes.map(|b| b as f64))
            .collect();
        let room = width.saturating_sub(text.chars().count());
        out.push(Line::from(vec![
            Span::styled(text, colour(level_of(m, &Resource::Swap))),
            Span::raw(spark(&series, mem.swap_total_bytes as f64, room)),
        ]));
    }
    match m.sample.host.pressure.memory.as_ref() {
        Some(p) => {
            let text = format!(
                "PSI  memory some {:>5.1}% full {:>5.1}%  ",
                p.some.avg10 * 100.0,
                p.full.map_or(0.0, |f| f.avg10 * 100.0)
            );
            let series: Vec<f64> = m
                .history
                .iter()
                .filter_map(|p| p.pressure_memory_some_avg10)
                .collect();
            let room = width.saturating_sub(text.chars().count());
            out.push(Line::from(vec![
                Span::styled(text, colour(level_of(m, &Resource::Pressure))),
                Span::raw(spark(&series, 1.0, room)),
            ]));
        }
        None => out.push(Line::raw("PSI  not on this kernel")),
    }
    out
}

fn gpu_lines(m: &Model, width: usize) -> Vec<Line<'static>> {
    if m.sample.gpus.is_empty() {
        return vec![Line::raw("GPUs none visible")];
    }
    m.sample
        .gpus
        .iter()
        .map(|g| {
            let (used, total) = (
                g.memory_used_bytes.unwrap_or(0),
                g.memory_total_bytes.unwrap_or(0),
            );
            let name: String = g
                .name
                .as_deref()
                .unwrap_or("GPU")
                .chars()
                .take(16)
                .collect();
            let text = format!(
                "GPU{} {:<16} {:>6}/{:<6} {:>3.0}% {:>6} left {:>4} {:>5} {:>4}  ",
                g.index,
                name,
                bytes(used),
                bytes(total),
                used as f64 * 100.0 / total.max(1) as f64,
                bytes(total.saturating_sub(used)),
                g.temperature_celsius
                    .map_or("-".into(), |t| format!("{t:.0}°C")),
                g.power_watts.map_or("-".into(), |p| format!("{p:.0}W")),
                g.utilization_gpu_ratio
                    .map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
            );
            let level = level_of(m, &Resource::GpuMemory(g.index))
                .max(level_of(m, &Resource::GpuTemperature(g.index)));
            let series: Vec<f64> = m
                .history
                .iter()
                .filter_map(|p| {
                    p.gpus
                        .iter()
                        .find(|x| x.index == g.index)
                        .and_then(|x| x.memory_used_bytes)
                        .map(|b| b as f64)
                })
                .collect();
            let room = width.saturating_sub(text.chars().count());
            Line::from(vec![
                Span::styled(text, colour(level)),
                Span::raw(spark(&series, total as f64, room)),
            ])
        })
        .collect()
}

fn process_table(m: &Model) -> Table<'static> {
    let rows: Vec<Row> = m
        .processes
        .iter()
        .map(|p| {
            Row::new(vec![
                Cell::from(p.gpu.to_string()),
                Cell::from(p.pid.to_string()),
                Cell::from(p.user.clone()),
                Cell::from(p.gpu_bytes.map_or("-".into(), bytes)),
                Cell::from(p.host_bytes.map_or("-".into(), bytes)),
                Cell::from(p.cpu_percent.map_or("-".into(), |c| format!("{c:.0}%"))),
                Cell::from(p.command.clone()),
            ])
        })
        .collect();
    Table::new(
        rows,
        [
            Constraint::Length(3),
            Constraint::Length(8),
            Constraint::Length(10),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(5),
            Constraint::Min(10),
        ],
    )
    .header(
        Row::new([
            "GPU", "PID", "USER", "GPU MEM", "HOST MEM", "CPU", "COMMAND",
        ])
        .style(Style::default().add_modifier(Modifier::BOLD)),
    )
}

/// The CUDA OOMs a job's trainer reported, after the rest of its line: how many, and the last
/// recovery's micro-batch.
fn cuda_oom_note(oom: Option<&crate::cuda_oom::CudaOoms>) -> String {
    let Some(o) = oom else {
        return String::new();
    };
    let last = o.last.as_ref().map(|l| &l.report);
    let what = match last {
        Some(r) if r.recovered => r
            .micro_batch_after
            .map(|a| {
                format!(
                    ", last recovered at micro-batch {} → {a}",
                    r.micro_batch_before
                )
            })
            .unwrap_or_default(),
        Some(r) => format!(", last stopped at micro-batch {}", r.micro_batch_before),
        None => String::new(),
    };
    format!(
        "; CUDA OOM ×{} ({} recovered{what})",
        o.recovered + o.stopped,
        o.recovered
    )
}

fn job_table(m: &Model, now_ms: u64) -> Table<'static> {
    let rows: Vec<Row> = super::sorted_jobs(m)
        .into_iter()
        .map(|j| {
            let (state, style, why) = match &j.pause {
                Some(p) => {
                    let until = j.pause_deadline.as_ref().map_or(String::new(), |d| {
                        format!(
                            "; {} in {}",
                            d.then,
                            human::duration(d.at_ms.saturating_sub(now_ms) as f64 / 1000.0)
                        )
                    });
                    (
                        format!(
                            "PAUSED {}",
                            human::duration(now_ms.saturating_sub(p.since_ms) as f64 / 1000.0)
                        ),
                        colour(Level::Critical),
                        format!(
                            "by {}: {}{until}",
                            crate::cli::status::paused_by(p.by),
                            p.reason
                        ),
                    )
                }
                None => (
                    "running".to_owned(),
                    Style::default(),
                    j.tightest.as_ref().map_or(String::new(), |l| {
                        format!(
                            "{}: {} left{}",
                            l.limit,
                            bytes(l.headroom_bytes),
                            l.time_to_exhaustion_seconds
                                .map(|t| format!(", full in {}", human::duration(t)))
                                .unwrap_or_default()
                        )
                    }),
                ),
            };
            let why = why + &cuda_oom_note(j.cuda_oom.as_ref());
            Row::new(vec![
                Cell::from(j.name.clone()),
                Cell::from(j.pid.to_string()),
                Cell::from(Span::styled(state, style)),
                Cell::from(why),
            ])
        })
        .collect();
    Table::new(
        rows,
        [
            Constraint::Length(14),
            Constraint::Length(8),
            Constraint::Length(14),
            Constraint::Min(20),
        ],
    )
    .header(
        Row::new(["JOB", "PID", "STATE", "WHY / TIGHTEST LIMIT"])
            .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_cuda_ooms_follow_its_line() {
        assert_eq!(cuda_oom_note(None), "");
        let mut oom = crate::cuda_oom::CudaOoms::default();
        let report = serde_json::from_value(serde_json::json!({
            "epoch": 1, "step": 4, "phase": "forward", "micro_batch_before": 8,
            "recovered": true, "micro_batch_after": 4, "accumulation_after": 2
        }))
        .expect("a report");
        oom.note(report, 1);
        assert_eq!(
            cuda_oom_note(Some(&oom)),
            "; CUDA OOM ×1 (1 recovered, last recovered at micro-batch 8 → 4)"
        );
    }

    #[test]
    fn sparklines_scale_to_capacity_and_keep_the_newest() {
        assert_eq!(spark(&[0.0, 50.0, 100.0], 100.0, 10), "▁▅█");
        assert_eq!(spark(&[0.0, 50.0, 100.0, 200.0], 100.0, 2), "██");
        assert_eq!(spark(&[1.0], 0.0, 5), "▁");
        assert_eq!(spark(&[], 1.0, 5), "");
    }
}
