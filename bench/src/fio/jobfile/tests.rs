//! The job-file parser's tests: fio's own files and formats, every option, the errors with
//! their lines, and mutated files that must never panic.

use super::*;
use aio_conformance::engine::Rng;

fn p(text: &str) -> Result<JobFile, JobFileError> {
    parse(text, Path::new("t.fio"))
}

/// The fio job file posted with QEMU's linux-aio patch "Cancel BH if not needed" (direct
/// completion processing, a bottom half only as the nested-loop safety net), unchanged.
const POSTED_LINUX_AIO_JOB: &str = "[global]
filename=/dev/vdb
ioengine=libaio
direct=1
runtime=60
ramp_time=5
gtod_reduce=1

[job1]
numjobs=4
iodepth=16
rw=randread
bs=4K
";

#[test]
fn the_job_file_posted_with_the_linux_aio_patch_parses() {
    let f = p(POSTED_LINUX_AIO_JOB).unwrap();
    assert_eq!(f.jobs.len(), 1);
    let j = &f.jobs[0];
    assert_eq!(j.name, "job1");
    assert_eq!(j.line, 9);
    assert_eq!(j.filename.as_deref(), Some(Path::new("/dev/vdb")));
    assert_eq!(j.engine, EngineKind::LinuxAio);
    assert!(j.direct && !j.time_based);
    assert_eq!(j.runtime, Some(Duration::from_secs(60)));
    assert_eq!(j.ramp, Duration::from_secs(5));
    assert_eq!((j.numjobs, j.iodepth, j.bs), (4, 16, 4096));
    assert_eq!(j.rw, Pattern::RandRead);
    assert_eq!(f.notes.len(), 1);
    assert!(f.notes[0].contains("t.fio:7") && f.notes[0].contains("gtod_reduce"));
    let two = p(&format!("{POSTED_LINUX_AIO_JOB}[job2]\n")).unwrap();
    assert_eq!(
        two.notes, f.notes,
        "a [global] note is given once, not per job"
    );
}

#[test]
fn globals_apply_to_later_jobs_only_and_jobs_override_them() {
    let f = p("; comment\n# another\n[global]\nbs=8k\n[a]\nbs=16k\n[b]\n[global]\niodepth=4\n[c]\nrw=randrw\nrwmixwrite=30\ntime_based\nfdmon=epoll\ndisks=64\npoll_max_ns=0\n")
        .unwrap();
    let [a, b, c] = &f.jobs[..] else {
        panic!("three jobs")
    };
    assert_eq!((a.bs, a.iodepth), (16384, 1));
    assert_eq!((b.bs, b.iodepth), (8192, 1));
    assert_eq!((c.bs, c.iodepth), (8192, 4));
    assert_eq!(
        (c.rw, c.rwmixread, c.time_based),
        (Pattern::RandReadWrite, 70, true)
    );
    assert_eq!(c.fdmon, Choice::Named(MonitorKind::Epoll));
    assert_eq!(
        (c.disks, c.poll_max_ns),
        (64, aio_loop::PollMaxNs::Fixed(0))
    );
}

#[test]
fn the_shipped_job_files_parse() {
    let f = p(include_str!("../../../jobs/uring-registered.fio")).unwrap();
    let opts: Vec<_> = f
        .jobs
        .iter()
        .map(|j| (j.register_files, j.fixed_bufs))
        .collect();
    assert_eq!(
        opts[..4],
        [(false, false), (true, false), (false, true), (true, true)]
    );
    let f = p(include_str!("../../../jobs/uring-vs-linux-aio.fio")).unwrap();
    assert_eq!(f.jobs.len(), 8);
    assert!(f.jobs.iter().all(|j| j.direct && j.time_based));
    let engines: Vec<_> = f.jobs.iter().map(|j| j.engine).collect();
    assert_eq!(
        engines[..4],
        [
            EngineKind::LinuxAio,
            EngineKind::Uring,
            EngineKind::Uring,
            EngineKind::LinuxAio
        ]
    );
}

#[test]
fn iodepth_batch_submit_sets_the_engine_batch() {
    let f = p("[a]\niodepth_batch_submit=8\n[b]\niodepth_batch=0\n[c]\n").unwrap();
    let got: Vec<_> = f.jobs.iter().map(|j| j.batch_submit).collect();
    assert_eq!(got, [Some(8), Some(0), None]);
    assert!(p("[a]\niodepth_batch_submit=5000\n").is_err());
}

#[test]
fn iothreads_is_parsed_and_defaults_to_one() {
    let f = p("[global]\niodepth=8\n[a]\niothreads=4\n[b]\n").unwrap();
    let got: Vec<_> = f.jobs.iter().map(|j| j.iothreads).collect();
    assert_eq!(got, [4, 1]);
}

#[test]
fn poll_rule_and_uring_taskrun_are_parsed() {
    let f = p("[a]\npoll_rule=qemu\nuring_taskrun=signal\n[b]\n").unwrap();
    assert_eq!(
        (f.jobs[0].poll_rule, f.jobs[0].uring_task_run),
        (PollRule::Qemu, "signal")
    );
    assert_eq!(
        (f.jobs[1].poll_rule, f.jobs[1].uring_task_run),
        (PollRule::Recovering, "auto")
    );
    let e = p("[a]\npoll_rule=fast\n").unwrap_err().to_string();
    assert!(e.contains("recovering or qemu"), "{e}");
    let e = p("[a]\nuring_taskrun=sqpoll\n").unwrap_err().to_string();
    assert!(e.contains("auto, signal, coop, defer"), "{e}");
}

#[test]
fn trims_and_sync_are_parsed_as_fio_names_them() {
    let f = p(
        "[global]\nbs=64k\n[t]\nrw=trim\n[rt]\nreadwrite=randtrim\nsync=1\n\
               [d]\nrw=write\nsync=dsync\n[s]\nrw=randwrite\nsync=sync\n[n]\nsync=none\n\
               [z]\nsync=0\n",
    )
    .unwrap();
    let got: Vec<_> = f.jobs.iter().map(|j| (j.rw, j.fua)).collect();
    assert_eq!(
        got,
        [
            (Pattern::Trim, false),
            (Pattern::RandTrim, true),
            (Pattern::Write, true),
            (Pattern::RandWrite, true),
            (Pattern::Read, false),
            (Pattern::Read, false),
        ]
    );
    assert!(f.jobs.iter().all(|j| j.bs == 65536));
    assert!(
        Pattern::RandTrim.modifies(100),
        "a trim job opens its file for writing"
    );
    // fio has no write-zeroes mode, and its trim-then-write modes are not run here.
    for (text, needle) in [
        ("[a]\nrw=write_zeroes\n", "unknown pattern 'write_zeroes'"),
        ("[a]\nrw=trimwrite\n", "trimwrite and randtrimwrite"),
        ("[a]\nrw=randtrimwrite\n", "are not supported"),
        ("[a]\nsync=fsync\n", "none, 0, 1, sync or dsync"),
        ("[a]\nsync\n", "needs a value"),
    ] {
        let e = p(text).unwrap_err();
        assert_eq!(e.line(), Some(2), "{text:?}: {e}");
        assert!(e.to_string().contains(needle), "{text:?}: {e}");
    }
}

#[test]
fn errors_name_the_file_and_line() {
    let cases: &[(&str, usize, &str)] = &[
        ("bs=4k\n[a]\n", 1, "before the first"),
        ("[a]\nbs=4x\n", 2, "bs=4x"),
        ("[a]\n\nfrobnicate=1\n", 3, "unknown option 'frobnicate'"),
        ("[a\n", 1, "closing"),
        ("[a]\nrw=sideways\n", 2, "rw=sideways"),
        ("[a]\nioengine=spdk\n", 2, "ioengine=spdk"),
        ("[a]\niodepth=0\n", 2, "1..=4096"),
        ("[a]\ndisks=257\n", 2, "1..=256"),
        ("[a]\nbs=1000\n", 2, "multiple of 512"),
        ("[a]\nruntime=soon\n", 2, "duration"),
        ("[a]\nfdmon=kqueue\n", 2, "kqueue"),
        ("[a]\npoll_max_ns=soon\n", 2, "or `auto`"),
        ("[a]\npoll_max_ns=2000000000\n", 2, "at most 1000000000 ns"),
        ("[a]\nfdmon=shared-ring\n", 2, "vs-fio and aio-peers only"),
        ("[a]\nsize=\n", 2, "needs a value"),
        ("[a]\ndirect=yes\n", 2, "0 or 1"),
        ("[global]\nbs=4k\n", 2, "no job section"),
        ("[a]\nbad key=1\n", 2, "not key=value"),
        (
            "[a]\n[global]\nfrobnicate=1\n",
            3,
            "unknown option 'frobnicate'",
        ),
        ("[a]\nkb_base=1000\n", 2, "kb_base=1024"),
        ("[a]\nbs=64m\niodepth=64\n", 1, "bytes of buffers"),
        ("[a]\niothreads=0\n", 2, "1..=64"),
        (
            "[a]\niothreads=2\n",
            1,
            "iothreads=2 is more than iodepth=1",
        ),
    ];
    for (text, line, needle) in cases {
        let e = p(text).unwrap_err();
        assert_eq!(e.line(), Some(*line), "{text:?}: {e}");
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("t.fio:{line}:")), "{msg}");
        assert!(msg.contains(needle), "{text:?}: '{msg}' lacks '{needle}'");
    }
}

/// Mutation fuzzing: random edits of valid files never panic, and every error names a line
/// of the file (or the line after its last one).
#[test]
fn fuzzed_job_files_never_panic_and_errors_name_a_line() {
    let corpus = [
        POSTED_LINUX_AIO_JOB,
        "[global]\nbs=8k\n[a]\nrw=randrw\nrwmixread=70\ntime_based\nruntime=2s\n",
        "[x]\nsize=1g\nfilename=/tmp/f\nioengine=io_uring\niodepth=32\n",
        "[t]\nrw=randtrim\nsync=dsync\nbs=64k\n",
    ];
    let alphabet: &[u8] = b"[]=;#\n kmgKMGs0123456789abcdefrwxyz_.\xff";
    let mut rng = Rng::new(7);
    let mut errors = 0;
    let cases = 20_000;
    for case in 0..cases {
        let mut bytes = corpus[case % corpus.len()].as_bytes().to_vec();
        for _ in 0..1 + rng.next_u64() % 6 {
            let at = (rng.next_u64() as usize) % (bytes.len() + 1);
            let c = alphabet[(rng.next_u64() as usize) % alphabet.len()];
            match rng.next_u64() % 3 {
                0 if at < bytes.len() => bytes[at] = c,
                1 if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => bytes.insert(at, c),
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let lines = text.lines().count().max(1);
        if let Err(e) = p(&text) {
            errors += 1;
            let line = e.line().expect("parse errors name a line");
            assert!((1..=lines).contains(&line), "{e} for {text:?}");
            assert!(e.to_string().starts_with(&format!("t.fio:{line}:")));
        }
    }
    assert!(
        errors > 0 && errors < cases,
        "mutations found both outcomes"
    );
}

#[test]
fn control_characters_in_errors_are_shown_escaped() {
    let e = parse("[j]\nrw=side\u{7}ways\n", "t.fio".as_ref()).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("side\\u{7}ways"), "{text}");
    let e = parse("[j]\nbo\u{1b}gus=1\n", "t.fio".as_ref()).unwrap_err();
    assert!(e.to_string().contains("bo\\u{1b}gus"), "{e}");
}

#[test]
fn cpus_allowed_and_its_policy_parse_as_fio_spells_them() {
    let f = p("[global]\ncpus_allowed=0-1,3\n[a]\n[b]\ncpus_allowed_policy=split\n").unwrap();
    assert_eq!(f.jobs[0].cpus_allowed, Some(vec![0, 1, 3]));
    assert!(!f.jobs[0].cpus_split, "shared is fio's default");
    assert!(f.jobs[1].cpus_split);
    assert_eq!(p("[a]\n").unwrap().jobs[0].cpus_allowed, None);
    for bad in [
        "cpus_allowed=2-1",
        "cpus_allowed=x",
        "cpus_allowed_policy=spread",
    ] {
        let e = p(&format!("[a]\n{bad}\n")).unwrap_err().to_string();
        assert!(e.contains(bad.split('=').next().unwrap()), "{bad}: {e}");
    }
}
