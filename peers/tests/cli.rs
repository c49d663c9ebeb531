//! The `aio-peers` binary as a user runs it: bad input refused before anything is set up, and a
//! short run on a file that measures every variant it names and writes the JSON report.

use std::process::{Command, Output};

fn peers(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aio-peers"))
        .args(args)
        .output()
        .expect("aio-peers runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_input_exits_2_and_says_what() {
    for (args, says) in [
        (&["--variants", "tokio"][..], "unknown variant \"tokio\""),
        (&["--bs", "4x"], "is not a size"),
        (&["--poll-max-ns", "2000000000"], "more than 1 s"),
        (&["--targets", "disk"], "disk"),
        (
            &["--targets", "file", "--dir", "/nonexistent/aio-peers"],
            "not an existing directory",
        ),
        (
            &["--targets", "file", "--bs", "1000"],
            "must be a non-zero multiple of 512",
        ),
    ] {
        let out = peers(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

/// The thread pool and tokio's `spawn_blocking` need nothing of the kernel beyond `pread`, so
/// this runs wherever the tests do (the io_uring peers are measured by hand: README).
#[test]
fn a_short_run_measures_each_variant_and_writes_the_report() {
    // O_DIRECT needs a file system that supports it: the target directory, not tmpfs.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let json = dir.path().join("peers.json");
    let out = peers(&[
        "--targets",
        "file",
        "--dir",
        dir.path().to_str().unwrap(),
        "--size",
        "8m",
        "--qd",
        "1,4",
        "--rounds",
        "2",
        "--secs",
        "100ms",
        "--ramp",
        "20ms",
        "--variants",
        "aio-pool-async,tokio-spawn-blocking",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("failed:"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the report")).unwrap();
    assert_eq!(report["failures"].as_array().map(Vec::len), Some(0));
    let targets = report["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 1, "{report}");
    // A row per variant and queue depth, each with a round per `--rounds`, every round with
    // reads completed and none failed; and the ratio of the two at each depth.
    let rows = targets[0]["rows"].as_array().expect("rows");
    for variant in ["aio-pool-async", "tokio-spawn-blocking"] {
        for qd in [1, 4] {
            let row = rows
                .iter()
                .find(|r| r["variant"] == variant && r["qd"] == qd)
                .unwrap_or_else(|| panic!("no row for {variant} at QD {qd}: {report}"));
            let rounds = row["rounds"].as_array().expect("rounds");
            assert_eq!(rounds.len(), 2, "{row}");
            for round in rounds {
                assert!(round["completed"].as_u64() > Some(0), "{row}");
                assert_eq!(round["errors"], 0, "{row}");
            }
        }
    }
    let ratios = targets[0]["ratios"].to_string();
    assert!(
        ratios.contains("QD4 IOPS aio-pool-async / tokio-spawn-blocking"),
        "{ratios}"
    );
    // The test file is removed when the run ends.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n != "peers.json")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
