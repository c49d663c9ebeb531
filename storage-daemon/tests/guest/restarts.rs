//! The daemon's side of a restart run: starting our daemon or qemu-storage-daemon on the
//! socket, stopping it (SIGKILL or SIGTERM), and the stopping thread that follows the guest's
//! console through a run.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use aio_test_support::launch::{Daemon, Launch};

use crate::harness::{export_args, ring_state, spawn, stop_cleanly};
use crate::{QUEUES, SERIAL};

/// How the daemon is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGKILL: a crash.
    Kill,
    /// SIGTERM: an upgrade (the daemon completes its requests, exits 0).
    Term,
}

/// Which daemon serves the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    /// aio-storage-daemon with the `--engine` given per start.
    Ours,
    /// qemu-storage-daemon's vhost-user-blk export, `aio=threads` or `aio=native`.
    Qsd { native: bool },
}

/// A small deterministic generator (xorshift64*), so a seed repeats a run's moments.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }

    pub(crate) fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

/// Starts the server on `socket` (its stale socket file removed first) and waits for it.
pub(crate) fn start(
    server: Server,
    engine: &str,
    dir: &Path,
    socket: &Path,
    image: &Path,
    n: usize,
) -> Daemon {
    let launch = match server {
        Server::Ours => Launch::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
            .label("aio-storage-daemon")
            .arg("--disk")
            .arg(format!(
                "socket={},image={},serial={SERIAL},queues={QUEUES}",
                socket.display(),
                image.display()
            ))
            .args(["--engine", engine]),
        Server::Qsd { native } => {
            let aio = if native { ",aio=native" } else { "" };
            let qcow2 = image.extension().is_some_and(|e| e == "qcow2");
            let format = if qcow2 { "qcow2" } else { "raw" };
            Launch::new("qemu-storage-daemon")
                .arg("--blockdev")
                .arg(format!(
                    "driver=file,node-name=file0,filename={},cache.direct=on{aio}",
                    image.display()
                ))
                .arg("--blockdev")
                .arg(format!("driver={format},node-name=disk0,file=file0"))
                .args(export_args(socket, QUEUES, true))
        }
    };
    spawn(
        launch
            .log_to(dir.join(format!("daemon-{n}.log")))
            .socket(socket),
    )
}

/// Stops `daemon` as `stop` says; a SIGTERM must end it with status 0.
pub(crate) fn stop_daemon(daemon: Daemon, stop: Stop) {
    match stop {
        Stop::Kill => drop(daemon),
        Stop::Term => stop_cleanly(daemon),
    }
}

/// What the console tells the stopping thread.
pub(crate) enum Moment {
    Boot,
    Idle,
    Fio,
    End,
    /// fio overran its deadline: the daemon is restarted once more, to tell a lost wakeup
    /// (the new daemon serves what waits) from a lost request (nothing comes back).
    Hung,
}

/// What the stopping thread needs: the run, the console's moments, the daemon it starts with.
pub(crate) struct StopperArgs {
    pub(crate) label: String,
    pub(crate) monitor: PathBuf,
    pub(crate) rx: mpsc::Receiver<Moment>,
    pub(crate) first: Daemon,
    pub(crate) server: Server,
    pub(crate) stop: Stop,
    pub(crate) fio_stops: usize,
    pub(crate) engines: Vec<String>,
    pub(crate) dir: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) disk: PathBuf,
    pub(crate) seed: u64,
}

/// The stopping thread: one stop at boot, one while idle, `fio_stops` while fio runs, each
/// followed by a start after a short random downtime. Gives the stops made, those during fio,
/// and the longest downtime.
pub(crate) fn stopping(a: StopperArgs) -> (usize, usize, Duration) {
    let mut rng = Rng(a.seed);
    let mut daemon = Some(a.first);
    let (mut stops, mut during_fio, mut longest) = (0, 0, Duration::ZERO);
    let restart = |daemon: &mut Option<Daemon>, rng: &mut Rng, stops: &mut usize| {
        let down = Instant::now();
        stop_daemon(daemon.take().expect("running"), a.stop);
        std::thread::sleep(rng.millis(100, 1000));
        *stops += 1;
        let engine = &a.engines[*stops % a.engines.len()];
        *daemon = Some(start(a.server, engine, &a.dir, &a.socket, &a.disk, *stops));
        down.elapsed()
    };
    let mut fio_start = Instant::now();
    while let Ok(moment) = a.rx.recv() {
        match moment {
            Moment::Boot | Moment::Idle => {
                std::thread::sleep(rng.millis(0, 1500));
                longest = longest.max(restart(&mut daemon, &mut rng, &mut stops));
            }
            Moment::Fio => {
                fio_start = Instant::now();
                for _ in 0..a.fio_stops {
                    // Ended (fio done or failed) while waiting: no more stops.
                    match a.rx.recv_timeout(rng.millis(500, 3000)) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Ok(Moment::End) => break,
                        _ => return (stops, during_fio, longest),
                    }
                    let at = fio_start.elapsed();
                    longest = longest.max(restart(&mut daemon, &mut rng, &mut stops));
                    println!(
                        "{}: stop {stops} at fio + {:.1} s",
                        a.label,
                        at.as_secs_f64()
                    );
                    during_fio += 1;
                }
            }
            Moment::End => {}
            Moment::Hung => {
                println!(
                    "{}: the guest is hung at fio + {:.1} s; one more restart",
                    a.label,
                    fio_start.elapsed().as_secs_f64()
                );
                println!(
                    "{}: the rings:\n{}",
                    a.label,
                    ring_state(&a.monitor, QUEUES)
                );
                restart(&mut daemon, &mut rng, &mut stops);
                std::thread::sleep(Duration::from_secs(5));
                if let Some(d) = &daemon {
                    println!("{}: the new daemon's log:\n{}", a.label, d.log());
                }
            }
        }
    }
    if let Some(d) = daemon {
        // Our daemon ends as documented; QEMU's is only stopped.
        if a.server == Server::Ours {
            stop_daemon(d, Stop::Term);
        }
    }
    (stops, during_fio, longest)
}
