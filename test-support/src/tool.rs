//! Running the tools tests compare with: a failure is the test's, with the tool's own words
//! and the Debian package that has it (`.ci/run` installs them all).
//!
//! This module owns starting a program and judging its exit; what its output means is the
//! test's.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The Debian package that has `program` (for the message of a test that cannot run it).
pub fn package_of(program: &str) -> &'static str {
    match program {
        "nbdinfo" | "nbdcopy" => "libnbd-bin",
        "nbdsh" => "python3-libnbd",
        "fio" => "fio",
        "openssl" => "openssl",
        "rbd" | "ceph" => "ceph-common",
        _ => "qemu-utils",
    }
}

/// The command that runs `program`: nbdsh is `python3 -m nbd` of the system's Python
/// (python3-libnbd), whatever `python3` a user's PATH finds first.
fn command(program: &str) -> Command {
    match program {
        "nbdsh" if Path::new("/usr/bin/nbdsh").exists() => {
            let mut c = Command::new("/usr/bin/python3");
            c.args(["-m", "nbd"]);
            c
        }
        _ => Command::new(program),
    }
}

/// Runs `program` with `args` whatever its exit status (a program that cannot be started
/// fails the test, naming its package).
pub fn output(program: &str, args: &[&str]) -> Output {
    output_in(None, program, args)
}

fn output_in(dir: Option<&Path>, program: &str, args: &[&str]) -> Output {
    let mut c = command(program);
    c.args(args);
    if let Some(dir) = dir {
        c.current_dir(dir);
    }
    c.output().unwrap_or_else(|e| {
        panic!(
            "{program}: {e} (install {}; .ci/run does)",
            package_of(program)
        )
    })
}

/// Runs `program` with `args`; its standard output. A failure is the test's, with the tool's
/// standard output and error.
pub fn run(program: &str, args: &[&str]) -> String {
    judged(program, args, output(program, args))
}

/// [`run`] in directory `dir`.
pub fn run_in(dir: &Path, program: &str, args: &[&str]) -> String {
    judged(program, args, output_in(Some(dir), program, args))
}

/// What a finished program said on both its streams, standard output then standard error, as
/// one text (for a message, or a test that looks for words in either).
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn judged(program: &str, args: &[&str], out: Output) -> String {
    assert!(out.status.success(), "{program} {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `program --version` runs here.
pub fn installed(program: &str) -> bool {
    command(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_gives_its_output_and_a_failure_its_words() {
        assert_eq!(run("sh", &["-c", "echo hello"]), "hello\n");
        assert_eq!(run_in(Path::new("/"), "pwd", &[]), "/\n");
        let failed = std::panic::catch_unwind(|| run("sh", &["-c", "echo why >&2; exit 3"]));
        let message = failed.unwrap_err();
        let text = message.downcast_ref::<String>().unwrap();
        assert!(text.contains("why"), "{text}");
        let both = output("sh", &["-c", "echo out; echo err >&2; exit 1"]);
        assert_eq!(super::text(&both), "out\nerr\n");
        assert!(installed("cat"));
        assert!(!installed("no-such-program-here"));
        assert_eq!(package_of("nbdinfo"), "libnbd-bin");
    }
}
