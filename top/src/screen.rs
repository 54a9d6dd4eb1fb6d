//! Drawing a frame: the live screen and the text frames of batch mode are the same drawing (a
//! text frame is the screen drawn into a buffer and printed without styles). Below
//! [`WIDE`] columns the tables keep their most telling columns only.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Row, Table, Widget};

use crate::format::{age, bytes, per_second, ppk, rate};
use crate::frame::{Agent, Frame};
use crate::view::ViewState;

/// From this width on, every column is shown.
pub const WIDE: u16 = 145;

/// One titled table.
struct Section {
    title: String,
    header: Vec<&'static str>,
    widths: Vec<u16>,
    rows: Vec<(Vec<String>, bool)>,
    /// A line shown instead of the rows when there are none.
    empty: Option<String>,
}

impl Section {
    fn height(&self) -> u16 {
        let body = if self.rows.is_empty() {
            1
        } else {
            self.rows.len().saturating_add(1)
        };
        u16::try_from(body.saturating_add(1)).unwrap_or(u16::MAX)
    }

    fn render(&self, area: Rect, buf: &mut Buffer, state: &ViewState) {
        let styled = |s: Style| if state.color { s } else { Style::default() };
        let [title, body] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
        Line::from(self.title.clone())
            .style(styled(Style::default().add_modifier(Modifier::BOLD)))
            .render(title, buf);
        if self.rows.is_empty() {
            Line::from(self.empty.clone().unwrap_or_default()).render(body, buf);
            return;
        }
        let rows = self.rows.iter().map(|(cells, alarm)| {
            let row = Row::new(cells.clone());
            if *alarm {
                row.style(styled(Style::default().fg(Color::Red)))
            } else {
                row
            }
        });
        let header = Row::new(self.header.clone()).style(styled(
            Style::default()
                .fg(Color::Cyan)
                .add_modifier(Modifier::BOLD),
        ));
        Table::new(rows, self.widths.iter().map(|w| Constraint::Length(*w)))
            .header(header)
            .column_spacing(1)
            .render(body, buf);
    }
}

/// Keeps the columns whose flag is set.
fn pick<T>(items: Vec<(T, bool)>) -> Vec<T> {
    items
        .into_iter()
        .filter(|(_, keep)| *keep)
        .map(|(t, _)| t)
        .collect()
}

fn rails_section(frame: &Frame, wide: bool) -> Section {
    let columns = [
        ("PID", 8, true),
        ("USER", 8, wide),
        ("AGE", 6, wide),
        ("XFER/s", 7, wide),
        ("DEVICE", 16, true),
        ("ASKED", 5, true),
        ("APPLIED", 7, true),
        ("RAIL", 4, true),
        ("NIC", 10, wide),
        ("TX/s", 10, true),
        ("RX/s", 10, true),
        ("PARTS/s", 7, wide),
        ("SRQ", 5, true),
        ("LOW", 4, wide),
        ("HIGH", 4, wide),
        ("ERR", 5, true),
        ("ERR/s", 5, wide),
        ("RETX/s", 6, wide),
        ("DOWN", 4, true),
    ];
    let mut rows = Vec::new();
    for p in &frame.processes {
        for (d_index, d) in p.devices.iter().enumerate() {
            for (r_index, r) in d.rails.iter().enumerate() {
                let first_of_process = d_index == 0 && r_index == 0;
                let first_of_device = r_index == 0;
                let only = |first: bool, text: String| if first { text } else { String::new() };
                let nic = format!("{}:{}{}", r.nic, r.port, if r.shared { "*" } else { "" });
                let cells = [
                    only(first_of_process, p.pid.to_string()),
                    only(first_of_process, p.user.clone()),
                    only(first_of_process, age(p.age_seconds)),
                    only(first_of_process, per_second(p.transfers_per_second)),
                    only(first_of_device, d.name.clone()),
                    only(first_of_device, ppk(d.split_asked)),
                    only(first_of_device, ppk(d.split_applied)),
                    r.rail.to_string(),
                    nic,
                    rate(r.sent_bytes_per_second),
                    rate(r.received_bytes_per_second),
                    per_second(r.transfers_per_second),
                    r.srq_depth.to_string(),
                    r.srq_low_water.to_string(),
                    r.srq_high_water.to_string(),
                    r.error_completions.to_string(),
                    per_second(r.error_completions_per_second),
                    per_second(r.retransmissions_per_second),
                    r.failed_over_connections.to_string(),
                ];
                // A rail its connections failed over from: the device runs on the other alone.
                let alarm = r.error_completions_per_second.unwrap_or(0.0) > 0.0
                    || r.retransmissions_per_second.unwrap_or(0.0) > 0.0
                    || r.failed_over_connections > 0;
                let cells = pick(cells.into_iter().zip(columns.iter().map(|c| c.2)).collect());
                rows.push((cells, alarm));
            }
        }
    }
    Section {
        title: format!(
            "RAILS  {} process(es)  (* a NIC two devices share)",
            frame.processes.len()
        ),
        header: pick(columns.iter().map(|c| (c.0, c.2)).collect()),
        widths: pick(columns.iter().map(|c| (c.1, c.2)).collect()),
        rows,
        empty: Some(match &frame.probes_dir_error {
            Some(e) => format!("probes directory {}: {e}", frame.probes_dir),
            None => format!("no process writes probes in {}", frame.probes_dir),
        }),
    }
}

/// What NCCL said a transfer served, as the screen shows it (`-`: nothing said).
fn operation(operation: Option<&crate::frame::Operation>) -> String {
    operation.map_or_else(|| "-".to_string(), |o| o.name.clone())
}

fn connections_section(frame: &Frame, wide: bool) -> Section {
    let columns = [
        ("PID", 8, true),
        ("PEER", 21, true),
        ("DIR", 4, true),
        ("DEVICE", 16, wide),
        ("MODE", 8, wide),
        ("PATH", 12, wide),
        ("FLOW", 4, wide),
        ("SOUT/s", 10, wide),
        ("SUP/s", 10, wide),
        ("TOTAL/s", 10, true),
        ("ASKED", 5, true),
        ("APPLIED", 7, true),
        ("OPERATION", 24, wide),
    ];
    let mut rows = Vec::new();
    for p in &frame.processes {
        for c in &p.connections {
            let cells = [
                p.pid.to_string(),
                c.peer.clone(),
                c.direction.to_string(),
                c.device.clone(),
                c.mode.to_string(),
                c.path.to_string(),
                c.flow.map_or("-".into(), |f| f.to_string()),
                rate(c.rail_bytes_per_second[0]),
                rate(c.rail_bytes_per_second[1]),
                rate(c.bytes_per_second),
                ppk(c.split_asked),
                ppk(c.split_applied),
                operation(c.operation.as_ref()),
            ];
            rows.push((
                pick(cells.into_iter().zip(columns.iter().map(|c| c.2)).collect()),
                false,
            ));
        }
    }
    let count = rows.len();
    Section {
        title: format!("CONNECTIONS  {count}"),
        header: pick(columns.iter().map(|c| (c.0, c.2)).collect()),
        widths: pick(columns.iter().map(|c| (c.1, c.2)).collect()),
        rows,
        empty: Some("no connection".into()),
    }
}

fn values_section(frame: &Frame) -> Section {
    let mut rows = Vec::new();
    for p in &frame.processes {
        for v in &p.values {
            let cells = vec![
                p.pid.to_string(),
                "process".into(),
                v.name.clone(),
                v.value.to_string(),
                per_second(v.per_second),
            ];
            rows.push((cells, false));
        }
        for d in &p.devices {
            for r in &d.rails {
                for v in &r.values {
                    let place = format!("{} {}", d.name, r.rail);
                    let cells = vec![
                        p.pid.to_string(),
                        place,
                        v.name.clone(),
                        v.value.to_string(),
                        per_second(v.per_second),
                    ];
                    rows.push((cells, false));
                }
            }
        }
    }
    Section {
        title: "VALUES  every value the probes files declare (v: back to connections)".into(),
        header: vec!["PID", "WHERE", "NAME", "VALUE", "PER SECOND"],
        widths: vec![8, 24, 40, 16, 12],
        rows,
        empty: Some("no process".into()),
    }
}

fn agent_section(frame: &Frame, wide: bool) -> Section {
    let columns = [
        ("FLOW", 4, true),
        ("SOUT PAIR", 31, wide),
        ("POLICY", 9, true),
        ("SUP_BW", 6, true),
        ("MEASURED", 8, true),
        ("THROUGHPUT", 11, true),
        ("CONNS", 5, true),
        ("SEEN", 5, wide),
    ];
    let (rows, empty) = match &frame.agent {
        Agent::Off => (Vec::new(), "not asked (--agent-control off)".to_string()),
        Agent::Unavailable { reason } => (Vec::new(), format!("no agent: {reason}")),
        Agent::Running { flows } => (
            flows
                .iter()
                .map(|f| {
                    let cells = [
                        f.flow.to_string(),
                        f.sout_pair.clone(),
                        f.policy.clone(),
                        f.sup_bw.to_string(),
                        ppk(f.measured_sup_bw),
                        rate(f.throughput_bytes_per_second),
                        f.connections.to_string(),
                        f.measured_connections
                            .map_or_else(|| "-".to_string(), |n| n.to_string()),
                    ];
                    (
                        pick(cells.into_iter().zip(columns.iter().map(|c| c.2)).collect()),
                        false,
                    )
                })
                .collect(),
            "the agent runs; no flow yet".to_string(),
        ),
    };
    Section {
        title: "AGENT  the split each flow is asked (parts per 1024 on SUP)".into(),
        header: pick(columns.iter().map(|c| (c.0, c.2)).collect()),
        widths: pick(columns.iter().map(|c| (c.1, c.2)).collect()),
        rows,
        empty: Some(empty),
    }
}

fn slowest_section(frame: &Frame) -> Section {
    let rows = frame
        .slowest
        .iter()
        .map(|s| {
            let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0} us"));
            let ago = frame.time_ns.saturating_sub(s.done_ns) as f64 / 1e9;
            let cells = vec![
                s.pid.to_string(),
                s.peer.clone(),
                s.direction.to_string(),
                bytes(s.bytes),
                us(Some(s.total_us)),
                us(s.rail_us[0]),
                us(s.rail_us[1]),
                s.sup_bw.to_string(),
                age(ago),
                operation(s.operation.as_ref()),
            ];
            (cells, false)
        })
        .collect();
    Section {
        title: "SLOWEST TRANSFERS  last minute".into(),
        header: vec![
            "PID",
            "PEER",
            "DIR",
            "SIZE",
            "TOTAL",
            "SOUT",
            "SUP",
            "SUP_BW",
            "AGO",
            "OPERATION",
        ],
        widths: vec![8, 21, 4, 9, 10, 10, 10, 6, 6, 24],
        rows,
        empty: Some("none".into()),
    }
}

fn skipped_section(frame: &Frame) -> Section {
    let rows = frame
        .skipped
        .iter()
        .map(|s| {
            (
                vec![s.reason.to_string(), s.path.clone(), s.detail.clone()],
                true,
            )
        })
        .collect();
    Section {
        title: format!("SKIPPED FILES  {}", frame.skipped.len()),
        header: vec!["REASON", "FILE", "WHY"],
        widths: vec![9, 40, 200],
        rows,
        empty: None,
    }
}

fn header_line(frame: &Frame, state: &ViewState) -> String {
    let connections: usize = frame.processes.iter().map(|p| p.connections.len()).sum();
    let mut text = format!(
        "mpib-top  {} processes  {connections} connections  interval {:.1} s  sort {}",
        frame.processes.len(),
        frame.interval_seconds,
        state.sort.name()
    );
    if !state.filter.is_empty() {
        text.push_str(&format!("  filter {:?}", state.filter));
    }
    if state.paused {
        text.push_str("  PAUSED");
    }
    text
}

/// The sections, in order, as `state` shows them at `width`.
fn sections(frame: &Frame, state: &ViewState, width: u16) -> Vec<Section> {
    let wide = width >= WIDE;
    let mut out = vec![rails_section(frame, wide)];
    out.push(if state.values {
        values_section(frame)
    } else {
        connections_section(frame, wide)
    });
    out.push(agent_section(frame, wide));
    out.push(slowest_section(frame));
    if !frame.skipped.is_empty() {
        out.push(skipped_section(frame));
    }
    out
}

/// The lines the drawing needs at `width` (a text frame's height).
pub fn height(frame: &Frame, state: &ViewState, width: u16) -> u16 {
    sections(frame, state, width).iter().fold(1u16, |lines, s| {
        lines.saturating_add(s.height()).saturating_add(1)
    })
}

/// Draws `frame` into `area`; `footer` is the keys line of the live screen.
pub fn draw(frame: &Frame, state: &ViewState, area: Rect, buf: &mut Buffer, footer: bool) {
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(u16::from(footer)),
    ])
    .areas(area);
    let bold = if state.color {
        Style::default().add_modifier(Modifier::REVERSED)
    } else {
        Style::default()
    };
    Line::from(header_line(frame, state))
        .style(bold)
        .render(head, buf);
    let sections = sections(frame, state, area.width);
    let mut constraints: Vec<Constraint> = sections
        .iter()
        .map(|s| Constraint::Length(s.height().saturating_add(1)))
        .collect();
    constraints.push(Constraint::Min(0));
    let areas = Layout::vertical(constraints).split(body);
    for (section, area) in sections.iter().zip(areas.iter()) {
        let [top, _gap] =
            Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(*area);
        section.render(top, buf, state);
    }
    if footer {
        let text = match &state.editing {
            Some(typed) => format!("filter: {typed}_   (Enter applies, Esc clears)"),
            None => {
                "q quit  r/e/i sort rate/errors/pid  f filter  p pause  v values  h help".into()
            }
        };
        Line::from(text).render(foot, buf);
    }
    if state.help {
        help(area, buf);
    }
}

fn help(area: Rect, buf: &mut Buffer) {
    let lines = [
        "r  sort by rate (bytes per second)",
        "e  sort by errors (error completions, retransmissions)",
        "i  sort by pid",
        "f or /  filter by pid, user, device or peer",
        "p or space  pause (the screen keeps its frame)",
        "v  every declared value instead of the connections",
        "h or ?  this help (any key closes it)",
        "q  quit",
    ];
    let width = 60.min(area.width);
    let height = (lines.len() as u16 + 2).min(area.height);
    let rect = Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    );
    Clear.render(rect, buf);
    Paragraph::new(lines.iter().map(|l| Line::from(*l)).collect::<Vec<_>>())
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(" mpib-top help "),
        )
        .render(rect, buf);
}

/// A text frame: the drawing at `width`, without styles, trailing blanks cut.
pub fn text(frame: &Frame, state: &ViewState, width: u16) -> String {
    let area = Rect::new(0, 0, width, height(frame, state, width));
    let mut buf = Buffer::empty(area);
    draw(frame, state, area, &mut buf, false);
    let mut out = String::new();
    for y in 0..area.height {
        let line: String = (0..area.width)
            .map(|x| buf[(x, y)].symbol().to_string())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}
