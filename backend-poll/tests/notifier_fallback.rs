//! The loop conformance suite on the notifier's pipe fallback: once with the pipe forced
//! (`AIO_NOTIFIER=pipe`), once in a child whose seccomp filter refuses `eventfd2` (EPERM, as a
//! container profile or a security module would). Each run is this test binary again, in a
//! child, running the `suite` module.

use std::process::Command;

/// The whole loop suite; the driver tests below run it in children. Run directly (no
/// variable, no filter) it runs on eventfd, as the main conformance binary does.
mod suite {
    aio_conformance::event_loop_conformance!(aio_backend_poll::PollLoop::new());

    /// The notifier is the kind the driver expects (`EXPECT_NOTIFIER`), so a run that
    /// silently stayed on eventfd fails.
    #[test]
    fn the_notifier_is_the_expected_kind() {
        let ctx = aio_loop::AioContext::new(aio_backend_poll::PollLoop::new()).unwrap();
        let kind = format!("{:?}", ctx.notifier_kind());
        if let Ok(expected) = std::env::var("EXPECT_NOTIFIER") {
            assert_eq!(kind, expected);
        }
    }
}

fn run_suite(cmd: &mut Command) {
    let out = cmd
        .args(["suite::", "--test-threads=2"])
        .env("EXPECT_NOTIFIER", "Pipe")
        .output()
        .expect("run the suite in a child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let passed = text
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    assert!(passed >= 20, "the whole suite ran: {text}");
}

#[test]
fn the_loop_suite_passes_on_a_forced_pipe_notifier() {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env("AIO_NOTIFIER", "pipe");
    run_suite(&mut cmd);
}

#[test]
fn the_loop_suite_passes_when_seccomp_refuses_eventfd() {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env_remove("AIO_NOTIFIER");
    aio_conformance::seccomp::refuse_syscalls(&mut cmd, &[libc::SYS_eventfd2, libc::SYS_eventfd]);
    run_suite(&mut cmd);
}
