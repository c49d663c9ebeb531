//! The `aio-bench` binary as a user runs it: bad input, job files, and `auto` when the kernel
//! refuses io_uring and Linux AIO (a seccomp filter in the child).

use std::path::PathBuf;

mod common;

use common::{bench, expect_bad_input, loop_device_unusable, text, TempDir};

#[test]
fn bad_input_exits_2_says_what_and_leaves_no_images() {
    let dir = TempDir::new("bad");
    let d = dir.0.to_str().unwrap();
    let bad_job = dir.0.join("bad.fio");
    std::fs::write(&bad_job, "[global]\nbs=4k\n[j]\nrw=sideways\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["matrix", "--fdmon", "kqueue"], "kqueue"),
        (
            vec!["matrix", "--fdmon", "shared-ring"],
            "only vs-fio (and aio-peers) build the pair",
        ),
        (vec!["matrix", "--engine", "spdk"], "spdk"),
        (vec!["matrix", "--workloads", "seq"], "seq"),
        (vec!["matrix", "--disks", "0"], "--disks"),
        (vec!["matrix", "--iothreads", "0"], "--iothreads"),
        (vec!["matrix", "--iothreads", "1,0"], "0 is not in 1..=64"),
        (vec!["matrix", "--queues", "0"], "--queues"),
        (vec!["matrix", "--queues", "0"], "0 is not in 1..=64"),
        (vec!["matrix", "--bs", "4x"], "4x"),
        (vec!["matrix", "--runtime", "soon"], "soon"),
        (
            vec!["matrix", "--dir", "/nonexistent/aio-bench"],
            "not an existing directory",
        ),
        (
            vec!["matrix", "--dir", "/etc/hostname"],
            "not an existing directory",
        ),
        (vec!["matrix", "--dir", d, "--disk-size", "64t"], "MiB free"),
        // Found before the first cell, not after the whole matrix has run.
        (
            vec!["matrix", "--json", "/nonexistent/aio-bench/out.json"],
            "--json /nonexistent/aio-bench/out.json: /nonexistent/aio-bench is not an existing directory",
        ),
        (
            vec!["matrix", "--svg", "/nonexistent/aio-bench/out.svg"],
            "--svg",
        ),
        (vec!["matrix", "--runtime", "0s"], "more than 0"),
        (vec!["vs-fio", "--runtime", "0"], "more than 0"),
        (vec!["latency", "--poll-max-ns", "soon"], "or `auto`"),
        (vec!["matrix", "--poll-max-ns", "2000000000"], "more than 1 s"),
        (
            vec!["vs-fio", "--fdmon", "shared-ring", "--engine", "pool"],
            "--fdmon shared-ring needs --engine uring (got pool)",
        ),
        (
            vec!["run", bad_job.to_str().unwrap()],
            "bad.fio:4: rw=sideways",
        ),
        (vec!["run", "/nonexistent/job.fio"], "/nonexistent/job.fio"),
    ];
    expect_bad_input(&cases);
    assert_eq!(dir.entries(), 1, "only the job file: no images left behind");
}

/// `--iothreads` (a list) and `--queues` from the command line to the reports: each K is a
/// row of the table and a cell of the JSON and the CSV, with Q and each iothread's CPU time.
#[test]
#[cfg(all(feature = "epoll", feature = "linux-aio"))]
fn matrix_reports_iothreads_and_queues() {
    let dir = TempDir::new("iot");
    let d = dir.0.to_str().unwrap();
    let (json, csv) = (dir.0.join("m.json"), dir.0.join("m.csv"));
    let o = bench()
        .args([
            "matrix",
            "--dir",
            d,
            "--engine",
            "linux-aio",
            "--fdmon",
            "epoll",
        ])
        .args([
            "--disks",
            "4",
            "--active",
            "all",
            "--workloads",
            "randrw",
            "--verify",
        ])
        .args([
            "--iothreads",
            "1,2",
            "--queues",
            "2",
            "--runtime",
            "100ms",
            "--ramp",
            "0s",
        ])
        .args(["--disk-size", "1m", "--json", json.to_str().unwrap()])
        .args(["--csv", csv.to_str().unwrap()])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("2 queues per disk") && t.contains("verify: "),
        "{t}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cells = v["cells"].as_array().unwrap();
    let k: Vec<u64> = cells
        .iter()
        .map(|c| c["iothreads"].as_u64().unwrap())
        .collect();
    assert_eq!(k, [1, 2]);
    assert!(cells.iter().all(|c| c["queues"] == 2));
    assert_eq!(cells[1]["per_iothread"].as_array().unwrap().len(), 2);
    let csv = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let (ki, qi) = (
        header.iter().position(|h| *h == "iothreads").unwrap(),
        header.iter().position(|h| *h == "queues").unwrap(),
    );
    let rows: Vec<(String, String)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[ki].to_string(), f[qi].to_string())
        })
        .collect();
    assert_eq!(rows, [("1".into(), "2".into()), ("2".into(), "2".into())]);
    assert_eq!(dir.entries(), 2, "the reports only: no images left behind");
}

#[test]
#[cfg(all(feature = "pool", feature = "poll"))]
fn run_reports_a_job_file_in_fio_json() {
    let dir = TempDir::new("run");
    let job = dir.0.join("j.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\ndirectory={}\nsize=1m\ndirect=1\n; fio's default engine is psync\n\
             [reads]\nrw=randread\niodepth=2\nfdmon=poll\ntime_based\nruntime=200ms\n",
            dir.0.display()
        ),
    )
    .unwrap();
    let o = bench()
        .args(["run", job.to_str().unwrap(), "--output-format=json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["jobs"][0]["jobname"], "reads");
    assert!(v["jobs"][0]["read"]["iops"].as_f64().unwrap() > 0.0);
    assert_eq!(v["jobs"][0]["aio-bench"]["engine"], "pool");
    assert_eq!(dir.entries(), 1, "the job's file is removed afterwards");
}

/// A randtrim job through each engine on files in the temp dir: fio's JSON `trim` section is
/// filled, nothing else is, and the blocks are freed (`st_blocks` drops). A `sync=dsync` job
/// writes FUA.
#[test]
#[cfg(all(
    feature = "pool",
    feature = "linux-aio",
    feature = "uring",
    feature = "poll"
))]
fn a_randtrim_job_fills_the_trim_section_and_frees_the_blocks() {
    use std::os::unix::fs::MetadataExt;
    const SIZE: usize = 4 << 20;
    let dir = TempDir::new("trim");
    let engines = common::usable(&["psync", "libaio", "io_uring"]);
    let mut job =
        String::from("[global]\nbs=64k\nsize=4m\ndirect=1\nfdmon=poll\niodepth=8\nrw=randtrim\n");
    let mut before = Vec::new();
    for &e in &engines {
        let file = dir.0.join(format!("{e}.img"));
        std::fs::write(&file, vec![0xa5u8; SIZE]).unwrap();
        std::fs::File::open(&file).unwrap().sync_all().unwrap();
        before.push(std::fs::metadata(&file).unwrap().blocks());
        job += &format!("[{e}]\nioengine={e}\nfilename={}\n", file.display());
    }
    job += &format!(
        "[fua]\nioengine=libaio\nrw=randwrite\nsync=dsync\nsize=1m\nfilename={}\n",
        dir.0.join("fua.img").display()
    );
    let path = dir.0.join("trim.fio");
    std::fs::write(&path, job).unwrap();
    let o = bench()
        .args(["run", path.to_str().unwrap(), "--output-format=json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for (i, e) in engines.iter().enumerate() {
        let j = &v["jobs"][i];
        assert_eq!(j["jobname"], *e);
        assert_eq!(j["job options"]["rw"], "randtrim");
        assert_eq!(j["aio-bench"]["errors"], 0, "{e}: {j}");
        let trim = &j["trim"];
        assert_eq!(trim["io_bytes"], SIZE as u64, "{e}: size= bytes trimmed");
        assert_eq!(trim["total_ios"], (SIZE >> 16) as u64, "{e}");
        assert!(trim["iops"].as_f64().unwrap() > 0.0, "{e}: {trim}");
        assert!(trim["lat_ns"]["mean"].as_f64().unwrap() > 0.0, "{e}");
        assert!(trim["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
        assert_eq!(j["read"]["io_bytes"], 0, "{e}");
        assert_eq!(j["write"]["io_bytes"], 0, "{e}");
        let file = dir.0.join(format!("{e}.img"));
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.len(), SIZE as u64, "{e}: a discard keeps the size");
        assert!(
            meta.blocks() < before[i],
            "{e}: st_blocks {} -> {}: no block was freed",
            before[i],
            meta.blocks()
        );
    }
    let fua = &v["jobs"][engines.len()];
    assert_eq!(fua["job options"]["sync"], "dsync");
    assert_eq!(fua["write"]["io_bytes"], 1 << 20, "{fua}");
    assert_eq!(fua["trim"]["io_bytes"], 0);
}

#[cfg(all(feature = "uring", feature = "linux-aio", feature = "pool"))]
fn probe_under(syscalls: &'static [libc::c_long]) -> String {
    let mut cmd = bench();
    cmd.arg("probe");
    aio_conformance::seccomp::refuse_syscalls(&mut cmd, syscalls);
    let o = cmd.output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    eprintln!("probe refusing {syscalls:?}:\n{t}");
    t
}

#[test]
#[cfg(all(feature = "uring", feature = "linux-aio", feature = "pool"))]
fn auto_falls_back_when_seccomp_refuses_io_uring_and_linux_aio() {
    const URING: &[libc::c_long] = &[libc::SYS_io_uring_setup];
    const BOTH: &[libc::c_long] = &[libc::SYS_io_uring_setup, libc::SYS_io_setup];
    // io_uring refused: linux-aio and hybrid.
    let t = probe_under(URING);
    assert!(t.contains("  fd monitor: hybrid\n"), "{t}");
    assert!(t.contains("  engine: linux-aio\n"), "{t}");
    assert!(
        t.contains("uring: passed over:"),
        "the reason is given: {t}"
    );
    // Both refused: the pool.
    let t = probe_under(BOTH);
    assert!(t.contains("  engine: pool\n"), "{t}");
    assert!(t.contains("linux-aio: passed over:"), "{t}");
    // io_uring and epoll refused: the fd monitor falls back to poll.
    const NO_EPOLL: &[libc::c_long] = &[libc::SYS_io_uring_setup, libc::SYS_epoll_create1];
    let t = probe_under(NO_EPOLL);
    assert!(t.contains("  fd monitor: poll\n"), "{t}");
    assert!(t.contains("hybrid: passed over:"), "{t}");
    // And the bench still runs, on what auto picked.
    let dir = TempDir::new("seccomp");
    let mut cmd = bench();
    cmd.args([
        "matrix",
        "--fdmon",
        "auto",
        "--engine",
        "auto",
        "--disks",
        "1,4",
        "--workloads",
        "rd",
        "--runtime",
        "200ms",
        "--ramp",
        "0ms",
        "--disk-size",
        "4m",
        "--dir",
        dir.0.to_str().unwrap(),
    ]);
    aio_conformance::seccomp::refuse_syscalls(&mut cmd, BOTH);
    let o = cmd.output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("engine pool (MB/s)") && t.contains("hybrid"),
        "{t}"
    );
    assert_eq!(dir.entries(), 0);
}

/// Starts `args` in a child, kills it with SIGKILL after `after`, and waits for it.
fn kill_9_after(args: &[&str], after: std::time::Duration) {
    let mut child = bench()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(after);
    // SIGKILL: no destructor, no signal handler runs.
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `kill -9` of a matrix or a job run, during image creation and mid-run, leaves nothing in
/// the directory: the images have no names (`O_TMPFILE`), only the killed process's fds.
#[test]
#[cfg(all(feature = "poll", feature = "pool"))]
fn kill_9_leaves_nothing_behind() {
    use std::time::Duration;
    let dir = TempDir::new("kill9");
    let d = dir.0.to_str().unwrap();
    let job = dir.0.join("j.fio");
    std::fs::write(
        &job,
        format!(
            "[j]\ndirectory={d}\nsize=256m\ndirect=1\nfdmon=poll\nrw=randread\ntime_based\n\
             runtime=5s\n"
        ),
    )
    .unwrap();
    let matrix = [
        "matrix",
        "--dir",
        d,
        "--fdmon",
        "poll",
        "--engine",
        "pool",
        "--disks",
        "16",
        "--active",
        "all",
        "--disk-size",
        "32m",
        "--runtime",
        "5s",
    ];
    // Early (creating the images), later (running), late (mid-cell).
    for ms in [30, 300, 1500] {
        kill_9_after(&matrix, Duration::from_millis(ms));
        assert_eq!(
            dir.entries(),
            1,
            "matrix killed after {ms} ms left something"
        );
        kill_9_after(&["run", job.to_str().unwrap()], Duration::from_millis(ms));
        assert_eq!(dir.entries(), 1, "run killed after {ms} ms left something");
    }
}

/// A loop device holding a mounted ext4, unmounted and detached on drop.
struct MountedExt4 {
    device: String,
    mount: PathBuf,
    _backing: TempDir,
}

impl MountedExt4 {
    fn new() -> Result<MountedExt4, String> {
        if let Some(reason) = loop_device_unusable() {
            return Err(reason);
        }
        let backing = TempDir::new("ext4");
        let img = backing.0.join("fs.img");
        std::fs::write(&img, vec![0u8; 32 << 20]).map_err(|e| e.to_string())?;
        let run = |cmd: &str, args: &[&str]| -> Result<String, String> {
            let o = std::process::Command::new(cmd)
                .args(args)
                .output()
                .map_err(|e| format!("{cmd}: {e}"))?;
            if !o.status.success() {
                return Err(format!("{cmd} {args:?}: {}", text(&o)));
            }
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let device = run("losetup", &["--find", "--show", img.to_str().unwrap()])?;
        let mount = backing.0.join("mnt");
        std::fs::create_dir_all(&mount).unwrap();
        let made = run("mkfs.ext4", &["-q", "-F", &device])
            .and_then(|_| run("mount", &[&device, mount.to_str().unwrap()]));
        if let Err(e) = made {
            let _ = run("losetup", &["-d", &device]);
            return Err(e);
        }
        Ok(MountedExt4 {
            device,
            mount,
            _backing: backing,
        })
    }
}

impl Drop for MountedExt4 {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.device])
            .status();
    }
}

/// `aio-bench run` refuses to write over a mounted file system (exit 2, naming the device and
/// `allow_mounted_write`), as fio does; reads stay allowed; the file system is clean after.
#[test]
#[cfg(feature = "pool")]
fn writing_over_a_mounted_file_system_is_refused() {
    let fs = match MountedExt4::new() {
        Ok(fs) => fs,
        Err(reason) => return aio_conformance::skip(&format!("no mounted ext4: {reason}")),
    };
    let dir = TempDir::new("mounted");
    let job = |rw: &str| {
        let path = dir.0.join(format!("{rw}.fio"));
        std::fs::write(
            &path,
            format!(
                "[j]\nrw={rw}\nfilename={}\nsize=8m\nbs=64k\ndirect=1\nfdmon=poll\n",
                fs.device
            ),
        )
        .unwrap();
        bench()
            .args(["run", path.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let o = job("write");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains(&fs.device) && t.contains("allow_mounted_write"),
        "{t}"
    );
    assert!(t.contains("mounted"), "{t}");
    let o = job("read");
    assert!(o.status.success(), "reads stay allowed: {}", text(&o));
    // Nothing was written: the file system checks clean once unmounted.
    let _ = std::process::Command::new("umount").arg(&fs.mount).status();
    let fsck = std::process::Command::new("fsck.ext4")
        .args(["-n", "-f", &fs.device])
        .output()
        .unwrap();
    assert!(fsck.status.success(), "fsck: {}", text(&fsck));
}

/// Requests that fail are reported as fio does: the first errno in the job's `err=`, what
/// failed on stderr, exit code 1. A job on a directory fails every request (EISDIR); writes
/// into a full file system (a 2 MiB tmpfs, a sparse 8 MiB file) fail mid-run with ENOSPC.
#[test]
#[cfg(feature = "pool")]
fn failed_requests_are_reported_with_their_errno_and_fail_the_run() {
    let dir = TempDir::new("err");
    let run = |job: &str| {
        let path = dir.0.join("j.fio");
        std::fs::write(&path, job).unwrap();
        bench()
            .args(["run", path.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let o = run(&format!(
        "[j]\nrw=read\nfilename={}\nsize=1m\nfdmon=poll\n",
        dir.0.display()
    ));
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("err= 21:"), "fio's err= is the first errno: {t}");
    assert!(
        t.contains("requests failed, the first with errno 21"),
        "{t}"
    );
    // A full disk mid-run (root: a small tmpfs).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return aio_conformance::skip("mounting a small tmpfs needs root");
    }
    let mnt = dir.0.join("small");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "aio-bench-full"])
        .arg(&mnt)
        .status()
        .unwrap();
    if !mounted.success() {
        // Root without CAP_SYS_ADMIN (a container).
        return aio_conformance::skip("mount refused a small tmpfs");
    }
    let file = mnt.join("disk.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let o = run(&format!(
        "[w]\nrw=write\nfilename={}\nsize=8m\nbs=64k\nfdmon=poll\n",
        file.display()
    ));
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("err= 28:"), "ENOSPC: {t}");
    assert!(
        t.contains("write: IOPS="),
        "the writes that fitted are counted: {t}"
    );
}

/// `latency --poll-max-ns auto --repeat 2 --detail`: the automatic window next to the fixed
/// ones, each cell run twice, and the detail lines that say what the loop did.
#[test]
#[cfg(feature = "pool")]
fn latency_compares_auto_with_fixed_windows_in_detail() {
    let dir = TempDir::new("latency");
    let o = bench()
        .args([
            "latency",
            "--engine",
            "pool",
            "--poll-max-ns",
            "auto",
            "--repeat",
            "2",
        ])
        .args(["--detail", "--runtime", "100ms", "--size", "4m", "--dir"])
        .arg(&dir.0)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("poll_max_ns=auto") && t.contains("2 run(s) each"),
        "{t}"
    );
    let detail: Vec<&str> = t.lines().filter(|l| l.starts_with("pool ")).collect();
    // The table's row, then one detail line per setting: 0, 32768, auto.
    assert_eq!(detail.len(), 4, "{t}");
    let auto = detail
        .iter()
        .find(|l| l.split_whitespace().nth(1) == Some("auto"));
    let auto = auto.expect("a detail line for auto");
    // The last four columns: the wake-up cost, the follow-up cost (at most two wake-ups),
    // auto's choices ("off/all") and its budget cuts per request.
    let cols: Vec<&str> = auto.split_whitespace().collect();
    let n = cols.len();
    let wake: u64 = cols[n - 4].parse().unwrap();
    assert!(wake > 0, "auto measured a wake-up cost: {auto}");
    let followup: u64 = cols[n - 3].parse().unwrap();
    assert!(followup <= 2 * wake, "{auto}");
    let (off, all) = cols[n - 2].split_once('/').expect("off/all");
    assert!(
        off.parse::<u64>().unwrap() <= all.parse::<u64>().unwrap(),
        "{auto}"
    );
    cols[n - 1]
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("budget cuts per request: {e}: {auto}"));
    assert_eq!(dir.entries(), 0, "the test file is removed");
}
