//! The capability ladder behind `auto`: try backends in order of preference, take the first
//! this kernel allows, and say why each one before it was passed over.
//!
//! This module owns the walk and its report, never a backend: the rungs are constructors the
//! caller takes from the backend crates it chose (no backend depends on another), so a program
//! that links only `aio-backend-uring` and `aio-pool` climbs uring -> pool.

use std::fmt;

/// What the ladder did at one rung.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RungReport {
    /// The rung's name.
    pub name: &'static str,
    /// `None`: built and picked; `Some(reason)`: passed over, and why.
    pub passed_over: Option<String>,
}

impl fmt::Display for RungReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.passed_over {
            None => write!(f, "{}: usable, picked", self.name),
            Some(why) => write!(f, "{}: passed over: {why}", self.name),
        }
    }
}

/// The rung a ladder took: its name, what it built, and the report of every rung tried.
#[derive(Debug)]
pub struct LadderChoice<T> {
    /// The name of the rung taken.
    pub name: &'static str,
    /// What its constructor built.
    pub value: T,
    /// One report per rung tried, the taken one last.
    pub reports: Vec<RungReport>,
}

/// No rung could build; the reports say why for each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no backend is usable: {}", join(.reports))]
pub struct NoneUsable {
    /// One report per rung, in order.
    pub reports: Vec<RungReport>,
}

fn join(reports: &[RungReport]) -> String {
    if reports.is_empty() {
        return "the ladder has no rungs".into();
    }
    reports
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<NoneUsable> for std::io::Error {
    fn from(e: NoneUsable) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::Unsupported, e)
    }
}

type Build<'a, T> = Box<dyn FnOnce() -> Result<T, String> + 'a>;

/// Backends in order of preference, tried in turn by [`Ladder::climb`].
///
/// io_uring can be switched off by a sysctl (`kernel.io_uring_disabled`) or refused by a
/// seccomp filter (container runtimes' default profiles), Linux AIO can be out of
/// `fs.aio-max-nr`: a VMM that picks its engine at start-up wants the best one that works and a
/// line for its log saying why.
///
/// ```
/// use aio::Ladder;
/// let choice = Ladder::new()
///     .rung("uring", || Err::<&str, _>("io_uring is disabled by the sysctl"))
///     .rung("pool", || Ok::<_, std::io::Error>("a thread pool"))
///     .climb()
///     .unwrap();
/// assert_eq!(choice.name, "pool");
/// assert_eq!(choice.reports[0].to_string(), "uring: passed over: io_uring is disabled by the sysctl");
/// assert_eq!(choice.reports[1].to_string(), "pool: usable, picked");
/// ```
pub struct Ladder<'a, T> {
    rungs: Vec<(&'static str, Build<'a, T>)>,
}

impl<T> fmt::Debug for Ladder<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.rungs.iter().map(|(name, _)| name))
            .finish()
    }
}

impl<T> Default for Ladder<'_, T> {
    fn default() -> Self {
        Ladder { rungs: Vec::new() }
    }
}

impl<'a, T> Ladder<'a, T> {
    /// A ladder with no rungs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rung below the others: `build` makes the backend or says why it cannot.
    pub fn rung<E: fmt::Display>(
        mut self,
        name: &'static str,
        build: impl FnOnce() -> Result<T, E> + 'a,
    ) -> Self {
        self.rungs
            .push((name, Box::new(move || build().map_err(|e| e.to_string()))));
        self
    }

    /// Tries the rungs in order and takes the first that builds; nothing after it is tried.
    pub fn climb(self) -> Result<LadderChoice<T>, NoneUsable> {
        let mut reports = Vec::new();
        for (name, build) in self.rungs {
            match build() {
                Ok(value) => {
                    reports.push(RungReport {
                        name,
                        passed_over: None,
                    });
                    return Ok(LadderChoice {
                        name,
                        value,
                        reports,
                    });
                }
                Err(why) => reports.push(RungReport {
                    name,
                    passed_over: Some(why),
                }),
            }
        }
        Err(NoneUsable { reports })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn takes_the_first_that_builds_and_tries_nothing_after_it() {
        let tried_last = Cell::new(false);
        let choice = Ladder::new()
            .rung("a", || Err::<u32, _>("EPERM"))
            .rung("b", || Ok::<_, String>(2))
            .rung("c", || {
                tried_last.set(true);
                Ok::<_, String>(3)
            })
            .climb()
            .unwrap();
        assert_eq!((choice.name, choice.value), ("b", 2));
        assert!(!tried_last.get());
        assert_eq!(
            choice.reports,
            [
                RungReport {
                    name: "a",
                    passed_over: Some("EPERM".into())
                },
                RungReport {
                    name: "b",
                    passed_over: None
                }
            ]
        );
    }

    #[test]
    fn none_usable_says_why_for_each() {
        let e = Ladder::<()>::new()
            .rung("uring", || Err::<(), _>("disabled by sysctl"))
            .rung("linux-aio", || Err::<(), _>("aio-max-nr"))
            .climb()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "no backend is usable: uring: passed over: disabled by sysctl; \
             linux-aio: passed over: aio-max-nr"
        );
        let io: std::io::Error = e.into();
        assert_eq!(io.kind(), std::io::ErrorKind::Unsupported);
        let empty = Ladder::<()>::new().climb().unwrap_err();
        assert!(empty.to_string().contains("no rungs"));
    }
}
