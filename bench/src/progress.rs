//! Progress of a long run (the matrix's cells, a job file's jobs) on stderr.
//!
//! This module owns the display only: an indicatif bar on a terminal, plain lines elsewhere.

use std::time::Duration;

/// Progress of a long run on stderr: an indicatif bar when stderr is a terminal, plain lines
/// otherwise (logs, CI).
#[derive(Debug)]
pub enum Progress {
    /// A bar, with each step's line printed above it.
    Bar(indicatif::ProgressBar),
    /// A line per step, `[done/total] line`; holds the total.
    Lines(u64),
}

impl Progress {
    /// Progress towards `total` steps of `unit` (`"cell runs"`, `"jobs"`).
    pub fn new(total: u64, unit: &str) -> Progress {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return Progress::Lines(total);
        }
        let bar = indicatif::ProgressBar::new(total);
        let template =
            format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit}, eta {{eta}}");
        if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(250));
        Progress::Bar(bar)
    }

    /// Step `done` of the total finished; `line` says what it measured.
    pub fn step(&self, done: u64, line: String) {
        match self {
            Progress::Bar(bar) => {
                bar.println(line);
                bar.set_position(done);
            }
            Progress::Lines(total) => eprintln!("[{done}/{total}] {line}"),
        }
    }

    /// Clears the bar (nothing for plain lines).
    pub fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}
