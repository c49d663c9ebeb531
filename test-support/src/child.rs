//! A child process that must end by itself: a refused daemon exits, one that was not refused
//! serves until killed, and then the test fails instead of hanging.
//!
//! This module owns the deadline; what the child's exit means is the test's.

use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// Waits for `child` to end within `limit`; its output. Past the limit the child is killed
/// and the test fails, quoting what it said.
pub fn ended_within(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().expect("the child's output"),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("the child's output");
                panic!(
                    "the child did not end within {limit:?}: {}",
                    crate::tool::text(&out)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_child_that_ends_gives_its_output_and_one_that_hangs_fails_the_test() {
        let quick = Command::new("sh")
            .args(["-c", "echo done"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = ended_within(quick, Duration::from_secs(30));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
        let slow = Command::new("sleep")
            .arg("60")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let hung = std::panic::catch_unwind(|| ended_within(slow, Duration::from_millis(100)));
        assert!(hung.is_err());
    }
}
