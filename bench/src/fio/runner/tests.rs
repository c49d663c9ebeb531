//! The job runner's tests: job files run end to end, `iothreads=` shares, and the errors
//! that name their job.

use super::*;
use crate::fio::jobfile;
use crate::fio::output::{to_fio_json, to_normal};
use std::path::Path;

#[test]
#[cfg(all(feature = "pool", feature = "poll"))]
fn a_job_file_runs_and_reports_in_fio_formats() {
    let dir = std::env::temp_dir().join(format!("aio-bench-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = format!(
        "[global]\ndirectory={}\nsize=1m\ndirect=1\nioengine=psync\nfdmon=poll\ngroup_reporting\n\
         [mixed]\nrw=randrw\nrwmixread=75\niodepth=4\nnumjobs=2\ntime_based\nruntime=200ms\ndisks=8\n\
         [sized]\nrw=write\nbs=64k\n",
        dir.display()
    );
    let f = jobfile::parse(&text, Path::new("test.fio")).unwrap();
    let reports: Vec<JobReport> = f.jobs.iter().map(|d| run_one(d).unwrap()).collect();
    assert_eq!(reports[0].def.name, "mixed");
    let mixed = &reports[0].result;
    assert!(mixed.read.ios > mixed.write.ios && mixed.write.ios > 0);
    assert_eq!(mixed.errors, 0);
    // Without time_based the job does its size (1 MiB) and stops.
    assert_eq!(reports[1].result.write.bytes, 1 << 20);
    assert_eq!(reports[1].result.write.ios, 16);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "files the run created are removed"
    );
    std::fs::remove_dir(&dir).unwrap();

    let text = to_normal(&reports);
    assert!(
        text.contains("mixed: (groupid=0, jobs=2): err= 0"),
        "{text}"
    );
    assert!(text.contains("  read: IOPS=") && text.contains("  write: IOPS="));
    assert!(text.contains("99.00th=["));

    let v = to_fio_json(&reports);
    // What fio-parsing tools read.
    let j = &v["jobs"][0];
    assert_eq!(j["jobname"], "mixed");
    let read = &j["read"];
    assert_eq!(read["io_bytes"].as_u64().unwrap(), mixed.read.bytes);
    assert!(read["bw_bytes"].as_u64().unwrap() > 0);
    assert!(read["iops"].as_f64().unwrap() > 0.0);
    assert!(read["lat_ns"]["mean"].as_f64().unwrap() > 0.0);
    assert!(read["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
    assert!(read["clat_ns"]["percentile"]["50.000000"].as_u64().unwrap() > 0);
    assert_eq!(v["jobs"][1]["write"]["io_bytes"], 1 << 20);
    assert_eq!(v["jobs"][1]["read"]["io_bytes"], 0);
    // fio's own parser in this crate reads it.
    let back = crate::fio::parse(&v.to_string(), &["read"]).unwrap();
    assert!((back.iops - read["iops"].as_f64().unwrap()).abs() < 1e-6);
}

#[test]
fn iothreads_share_the_file_the_depth_and_the_idle_disks() {
    let f = jobfile::parse(
        "[j]\nbs=4k\niodepth=5\ndisks=6\niothreads=2\n",
        Path::new("x.fio"),
    )
    .unwrap();
    let s = shares(&f.jobs[0], 5 * 4096 + 100, 2);
    assert_eq!(s[0].region, 0..2 * 4096);
    assert_eq!(s[1].region, 2 * 4096..5 * 4096 + 100);
    assert_eq!((s[0].iodepth, s[1].iodepth), (3, 2));
    // Idle disks 1..=5: 2 and 4 on iothread 0; 1, 3 and 5 on iothread 1.
    assert_eq!((s[0].idle_fds, s[1].idle_fds), (2, 3));
    let one = shares(&f.jobs[0], 8192, 1);
    assert_eq!(
        (one[0].region.clone(), one[0].iodepth, one[0].idle_fds),
        (0..8192, 5, 5)
    );
}

/// `iothreads=2`: two threads, each with its own loop and engine, share the job; without
/// `time_based` they do `size` bytes together, each its half of the file.
#[test]
#[cfg(all(feature = "pool", feature = "poll"))]
fn a_job_on_two_iothreads_does_its_size_once() {
    let dir = std::env::temp_dir().join(format!("aio-bench-run-iot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = format!(
        "[global]\ndirectory={}\nsize=1m\ndirect=1\nfdmon=poll\n\
         [split]\nrw=randwrite\nbs=64k\niodepth=4\niothreads=2\ndisks=3\n\
         [tiny]\nsize=64k\nbs=64k\niodepth=2\niothreads=2\n",
        dir.display()
    );
    let f = jobfile::parse(&text, Path::new("iot.fio")).unwrap();
    let r = run_one(&f.jobs[0]).unwrap();
    assert_eq!((r.result.write.bytes, r.result.write.ios), (1 << 20, 16));
    assert_eq!(r.result.errors, 0);
    assert!(to_normal(std::slice::from_ref(&r)).contains("iothreads=2"));
    assert_eq!(to_fio_json(&[r])["jobs"][0]["aio-bench"]["iothreads"], 2);
    let e = run_one(&f.jobs[1]).unwrap_err().to_string();
    assert!(e.contains("fewer than iothreads=2"), "{e}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn a_missing_file_without_size_is_an_error_naming_the_job() {
    let f = jobfile::parse(
        "[j]\nfilename=/nonexistent/aio-bench/file\nfdmon=poll\n",
        Path::new("x.fio"),
    )
    .unwrap();
    let e = run_one(&f.jobs[0]).unwrap_err().to_string();
    assert!(
        e.contains("job 'j' (line 1)") && e.contains("no size="),
        "{e}"
    );
}

#[test]
fn io_uring_options_on_another_engine_are_an_error_naming_the_job() {
    let f = jobfile::parse(
        "[j]\nioengine=libaio\nfixedbufs\nsize=1m\nfilename=/nonexistent/aio-bench/f\n",
        Path::new("x.fio"),
    )
    .unwrap();
    let e = run_one(&f.jobs[0]).unwrap_err().to_string();
    assert!(
        e.contains("job 'j' (line 1)") && e.contains("io_uring options"),
        "{e}"
    );
}

/// A job whose new files would need more than the file system has free is refused before
/// anything is written (fio would write until the disk is full): exit 2, the message naming
/// the job, the size and the free space. The numjobs clones' files count together.
#[test]
fn a_job_that_would_fill_the_file_system_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let free = crate::targets::image::free_bytes_of(dir.path()).expect("statvfs");
    // Each clone's file fits alone, the three together need more than half again what is free.
    let half = free / 2 + (1 << 20);
    for (text, needed) in [
        (
            "[fill]\nrw=write\nsize=1p\nfdmon=poll\n".to_string(),
            1u64 << 50,
        ),
        (
            format!("[fill]\nrw=write\nsize={half}\nnumjobs=3\nfdmon=poll\n"),
            3 * half,
        ),
    ] {
        let text = format!("{text}directory={}\n", dir.path().display());
        let f = jobfile::parse(&text, Path::new("x.fio")).unwrap();
        let e = run_one(&f.jobs[0]).unwrap_err();
        assert!(matches!(e, RunError::NoSpace { .. }), "{e}");
        let code = crate::error::BenchError::Job(e).exit_code();
        assert_eq!(code, crate::error::EXIT_BAD_INPUT);
        let text = run_one(&f.jobs[0]).unwrap_err().to_string();
        assert!(text.contains("job 'fill' (line 1)"), "{text}");
        assert!(text.contains(&format!("size={needed} bytes")), "{text}");
        assert!(text.contains("bytes free"), "{text}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing written"
        );
    }
}

/// fio's `cpus_allowed` with `cpus_allowed_policy`: shared gives every clone the whole list,
/// split one CPU each, in turn; and a job pinned to CPU 0 runs there (its pool's threads too,
/// which it starts).
#[test]
fn clones_run_on_the_cpus_the_job_allows() {
    let f = jobfile::parse(
        "[s]\ncpus_allowed=0,1\n[p]\ncpus_allowed=0,1\ncpus_allowed_policy=split\n[n]\n",
        Path::new("x.fio"),
    )
    .unwrap();
    let (shared, split, none) = (&f.jobs[0], &f.jobs[1], &f.jobs[2]);
    assert_eq!(clone_cpus(shared, 3), Some(vec![0, 1]));
    assert_eq!(
        (0..3).map(|n| clone_cpus(split, n)).collect::<Vec<_>>(),
        [Some(vec![0]), Some(vec![1]), Some(vec![0])]
    );
    assert_eq!(clone_cpus(none, 0), None);
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[pinned]\nrw=randread\nsize=1m\nnumjobs=2\ncpus_allowed=0\ncpus_allowed_policy=split\n\
         fdmon=poll\ndirectory={}\n",
        dir.path().display()
    );
    let f = jobfile::parse(&text, Path::new("x.fio")).unwrap();
    let r = run_one(&f.jobs[0]).unwrap();
    assert_eq!(
        (r.result.read.bytes, r.result.errors),
        (2 << 20, 0),
        "{:?}",
        r.result
    );
    let bad = jobfile::parse(
        &format!(
            "[far]\nrw=read\nsize=1m\ncpus_allowed=1023\ndirectory={}\n",
            dir.path().display()
        ),
        Path::new("x.fio"),
    )
    .unwrap();
    let e = run_one(&bad.jobs[0]).unwrap_err().to_string();
    assert!(e.contains("job 'far'") && e.contains("1023"), "{e}");
}

/// `pool_spin=` runs the job's thread pool with its workers waiting that long for the next job
/// before they sleep; on another engine it is an error naming the job.
#[test]
#[cfg(all(feature = "pool", feature = "poll"))]
fn pool_spin_applies_to_the_thread_pool_only() {
    let dir = tempfile::tempdir().unwrap();
    let text = |engine: &str| {
        format!(
            "[spin]\nioengine={engine}\npool_spin=50us\nrw=randread\nsize=1m\ndirect=1\n\
             fdmon=poll\ndirectory={}\n",
            dir.path().display()
        )
    };
    let f = jobfile::parse(&text("psync"), Path::new("x.fio")).unwrap();
    assert_eq!(f.jobs[0].pool_spin, std::time::Duration::from_micros(50));
    let r = run_one(&f.jobs[0]).unwrap();
    assert_eq!((r.result.read.bytes, r.result.errors), (1 << 20, 0));
    let f = jobfile::parse(&text("libaio"), Path::new("x.fio")).unwrap();
    let e = run_one(&f.jobs[0]).unwrap_err().to_string();
    assert!(e.contains("job 'spin'") && e.contains("pool_spin"), "{e}");
}
