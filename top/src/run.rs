//! The loops: the live screen (keys between samples, never blocking a sample on a key), and the
//! batch frames.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{execute, terminal};
use ratatui::Terminal;

use crate::config::{Config, Output};
use crate::frame::Frame;
use crate::sample::Sampler;
use crate::screen;
use crate::view::{self, SortKey, ViewState};

/// Runs `config` until it is done or the operator quits.
///
/// # Errors
///
/// The terminal could not be set up, or standard output went away.
pub fn run(config: &Config) -> Result<(), String> {
    let state = ViewState::new(config.sort, config.filter.clone(), config.color);
    let sampler = Sampler::new(config.sources.clone());
    match config.output {
        Output::Batch { iterations, json } => batch(sampler, &state, config, iterations, json),
        Output::Interactive => {
            if !io::stdout().is_terminal() {
                return Err(
                    "standard output is not a terminal: use -b (batch frames) or --once".into(),
                );
            }
            interactive(sampler, state, config.interval)
        }
    }
}

fn batch(
    mut sampler: Sampler,
    state: &ViewState,
    config: &Config,
    iterations: Option<u64>,
    json: bool,
) -> Result<(), String> {
    // The first sample only starts the rates: every printed frame covers one interval.
    sampler.sample();
    let mut next = Instant::now() + config.interval;
    let mut printed = 0;
    let mut out = io::stdout().lock();
    while iterations.map_or(true, |n| printed < n) {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        next += config.interval;
        let shown = view::apply(&sampler.sample(), state);
        let text = if json {
            let mut doc = serde_json::to_string(&shown).map_err(|e| e.to_string())?;
            doc.push('\n');
            doc
        } else {
            let mut text = screen::text(&shown, state, config.width);
            text.push('\n');
            text
        };
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            // A reader that stopped reading (`| head`) ends the run, as it ends `top -b`.
            return if e.kind() == io::ErrorKind::BrokenPipe {
                Ok(())
            } else {
                Err(e.to_string())
            };
        }
        printed += 1;
    }
    Ok(())
}

/// Restores the terminal however the screen ends.
struct Screen;

impl Screen {
    fn enter() -> Result<Screen, String> {
        terminal::enable_raw_mode().map_err(|e| format!("cannot set up the terminal: {e}"))?;
        let screen = Screen;
        execute!(io::stdout(), terminal::EnterAlternateScreen)
            .map_err(|e| format!("cannot set up the terminal: {e}"))?;
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            hook(info);
        }));
        Ok(screen)
    }
}

fn restore() {
    let _ = execute!(io::stdout(), terminal::LeaveAlternateScreen);
    let _ = terminal::disable_raw_mode();
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

fn interactive(
    mut sampler: Sampler,
    mut state: ViewState,
    interval: Duration,
) -> Result<(), String> {
    let _screen = Screen::enter()?;
    let backend = CrosstermBackend::new(io::stdout());
    let mut terminal = Terminal::new(backend).map_err(|e| e.to_string())?;
    terminal.hide_cursor().map_err(|e| e.to_string())?;
    let mut frame: Frame = sampler.sample();
    let mut next = Instant::now() + interval;
    loop {
        let shown = view::apply(&frame, &state);
        terminal
            .draw(|f| screen::draw(&shown, &state, f.area(), f.buffer_mut(), true))
            .map_err(|e| e.to_string())?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait).map_err(|e| e.to_string())? {
            match event::read().map_err(|e| e.to_string())? {
                Event::Key(key)
                    if key.kind != KeyEventKind::Release && key_pressed(&mut state, key) =>
                {
                    return Ok(());
                }
                // A resize redraws at the new size at once.
                _ => {}
            }
            continue;
        }
        next += interval;
        if Instant::now() > next {
            next = Instant::now() + interval;
        }
        if !state.paused {
            frame = sampler.sample();
        }
    }
}

/// Applies a key; `true` to quit.
pub fn key_pressed(state: &mut ViewState, key: KeyEvent) -> bool {
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return true;
    }
    if let Some(typed) = state.editing.as_mut() {
        match key.code {
            KeyCode::Enter => state.filter = state.editing.take().unwrap_or_default(),
            KeyCode::Esc => {
                state.editing = None;
                state.filter.clear();
            }
            KeyCode::Backspace => {
                typed.pop();
            }
            KeyCode::Char(c) => typed.push(c),
            _ => {}
        }
        return false;
    }
    if state.help {
        state.help = false;
        return false;
    }
    match key.code {
        KeyCode::Char('q') | KeyCode::Esc => return true,
        KeyCode::Char('r') => state.sort = SortKey::Rate,
        KeyCode::Char('e') => state.sort = SortKey::Errors,
        KeyCode::Char('i') => state.sort = SortKey::Pid,
        KeyCode::Char('f' | '/') => state.editing = Some(state.filter.clone()),
        KeyCode::Char('p' | ' ') => state.paused = !state.paused,
        KeyCode::Char('v') => state.values = !state.values,
        KeyCode::Char('h' | '?') => state.help = true,
        _ => {}
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(state: &mut ViewState, code: KeyCode) -> bool {
        key_pressed(state, KeyEvent::new(code, KeyModifiers::NONE))
    }

    #[test]
    fn keys_change_the_view() {
        let mut s = ViewState::new(SortKey::Rate, String::new(), true);
        assert!(!press(&mut s, KeyCode::Char('e')));
        assert_eq!(s.sort, SortKey::Errors);
        press(&mut s, KeyCode::Char('f'));
        for c in "10.0".chars() {
            press(&mut s, KeyCode::Char(c));
        }
        press(&mut s, KeyCode::Backspace);
        assert!(
            !press(&mut s, KeyCode::Char('q')),
            "q is typed into the filter"
        );
        press(&mut s, KeyCode::Enter);
        assert_eq!(s.filter, "10.q");
        press(&mut s, KeyCode::Char('/'));
        press(&mut s, KeyCode::Esc);
        assert_eq!(s.filter, "");
        press(&mut s, KeyCode::Char('h'));
        assert!(
            !press(&mut s, KeyCode::Char('q')),
            "a key closes the help first"
        );
        assert!(!s.help);
        press(&mut s, KeyCode::Char(' '));
        assert!(s.paused);
        assert!(press(&mut s, KeyCode::Char('q')));
        assert!(key_pressed(
            &mut s,
            KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)
        ));
    }
}
