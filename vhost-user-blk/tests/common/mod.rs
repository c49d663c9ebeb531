//! Shared by the integration tests: a daemon started as a child process, and a libblkio
//! client of its socket.

#![allow(dead_code)]

use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blkio::{Blkio, Blkioq, MemoryRegion, ReqFlags};

/// The daemon binary, started with `args`; killed (SIGKILL) on drop if still running.
pub struct Daemon {
    pub child: Child,
    pub sockets: Vec<PathBuf>,
    /// Its stderr, shown (in the test's captured output) when it is dropped.
    log: std::fs::File,
}

/// What `log` holds from its start.
fn read_log(log: &mut std::fs::File) -> String {
    use std::io::{Read, Seek};
    let mut text = String::new();
    let _ = log.seek(std::io::SeekFrom::Start(0));
    let _ = log.read_to_string(&mut text);
    text
}

impl Daemon {
    /// Starts the daemon and waits until every socket accepts connections.
    ///
    /// A daemon that could not build its io_uring ring within the locked-memory limit (a
    /// budget of the user, shared with the tests running beside this one, which give it back
    /// when they end) is started again, for up to 20 s; any other early exit fails the test
    /// with the daemon's message.
    pub fn start(args: &[String], sockets: Vec<PathBuf>) -> Daemon {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match Daemon::try_start(args, sockets.clone(), deadline) {
                Ok(d) => return d,
                Err(message) if message.contains("RLIMIT_MEMLOCK") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(message) => panic!("the daemon exited before listening: {message}"),
            }
        }
    }

    fn try_start(
        args: &[String],
        sockets: Vec<PathBuf>,
        deadline: Instant,
    ) -> Result<Daemon, String> {
        // Its messages go to a file, read if it exits early, and shown as they were after.
        let log = tempfile::tempfile().expect("a file for the daemon's stderr");
        let child = Command::new(env!("CARGO_BIN_EXE_aio-vhost-user-blk"))
            .args(args)
            .stdin(Stdio::null())
            .stderr(log.try_clone().expect("dup"))
            .spawn()
            .expect("start the daemon");
        let mut d = Daemon {
            child,
            sockets,
            log,
        };
        while !d.sockets.iter().all(|s| s.exists()) {
            if let Some(status) = d.child.try_wait().unwrap() {
                let text = read_log(&mut d.log);
                return Err(format!("{status}: {text}"));
            }
            assert!(
                Instant::now() < deadline,
                "the daemon's sockets did not appear"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    /// One disk on `image` with `engine` and extra disk keys (`,readonly=on`...).
    pub fn one_disk(dir: &Path, image: &Path, engine: &str, extra: &str) -> Daemon {
        let socket = dir.join("vhost.sock");
        let args = vec![
            "--disk".to_string(),
            format!(
                "socket={},image={}{extra}",
                socket.display(),
                image.display()
            ),
            "--engine".to_string(),
            engine.to_string(),
        ];
        Daemon::start(&args, vec![socket])
    }

    pub fn socket(&self) -> &Path {
        &self.sockets[0]
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid; no memory involved.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprint!("{}", read_log(&mut self.log));
    }
}

/// An image file of `bytes` in a fresh temporary directory (in /dev/shm when it exists, so
/// O_DIRECT works without a disk).
pub fn image(bytes: u64) -> (tempfile::TempDir, PathBuf) {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    let dir = tempfile::Builder::new()
        .prefix("aio-vub-")
        .tempdir_in(base)
        .unwrap();
    let path = dir.path().join("disk.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(bytes).unwrap();
    (dir, path)
}

/// A libblkio virtio-blk-vhost-user client with `queues` queues and one buffer region.
pub struct Client {
    pub blkio: Blkio,
    pub queues: Vec<Blkioq>,
    pub region: MemoryRegion,
}

impl Client {
    pub fn connect(
        socket: &Path,
        queues: usize,
        region_bytes: usize,
    ) -> Result<Client, blkio::Error> {
        Client::connect_with(socket, queues, region_bytes, false)
    }

    /// As `connect`; `read_only` opens the device read-only (libblkio refuses to start a
    /// writable client of a read-only device).
    pub fn connect_with(
        socket: &Path,
        queues: usize,
        region_bytes: usize,
        read_only: bool,
    ) -> Result<Client, blkio::Error> {
        let mut b = Blkio::new("virtio-blk-vhost-user")?;
        b.set_bool("read-only", read_only)?;
        b.set_str("path", socket.to_str().unwrap())?;
        b.connect()?;
        b.set_i32("num-queues", queues as i32)?;
        let started = b.start()?;
        let region = b.alloc_mem_region(region_bytes)?;
        b.map_mem_region(&region)?;
        Ok(Client {
            blkio: b,
            queues: started.queues,
            region,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.blkio.get_u64("capacity").unwrap()
    }

    /// The buffer at `offset` in the region.
    pub fn buf(&mut self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.region.len);
        // SAFETY: the region is mapped for our process for `region.len` bytes and lives as
        // long as the client; the tests use disjoint ranges for requests in flight.
        unsafe { std::slice::from_raw_parts_mut((self.region.addr + offset) as *mut u8, len) }
    }

    /// Waits for `n` completions on queue `q` and returns their (user_data, ret).
    pub fn wait(&mut self, q: usize, n: usize) -> Vec<(usize, i32)> {
        let mut out = Vec::new();
        let mut done: Vec<MaybeUninit<blkio::Completion>> =
            (0..n).map(|_| MaybeUninit::uninit()).collect();
        while out.len() < n {
            let want = n - out.len();
            let mut timeout = Duration::from_secs(20);
            let got = self.queues[q]
                .do_io(&mut done[..want], want, Some(&mut timeout), None)
                .expect("do_io");
            assert!(got > 0, "no completion within 20 s");
            for c in &done[..got] {
                // SAFETY: do_io initialised the first `got` completions.
                let c = unsafe { c.assume_init_ref() };
                out.push((c.user_data, c.ret));
            }
        }
        out
    }

    pub fn read(&mut self, q: usize, offset: u64, buf_at: usize, len: usize, tag: usize) {
        let ptr = (self.region.addr + buf_at) as *mut u8;
        self.queues[q].read(offset, ptr, len, tag, ReqFlags::empty());
    }

    pub fn write(&mut self, q: usize, offset: u64, buf_at: usize, len: usize, tag: usize) {
        let ptr = (self.region.addr + buf_at) as *const u8;
        self.queues[q].write(offset, ptr, len, tag, ReqFlags::empty());
    }

    /// One request on queue `q`, waited for: its `ret`.
    pub fn sync(&mut self, q: usize, submit: impl FnOnce(&mut Blkioq)) -> i32 {
        submit(&mut self.queues[q]);
        self.wait(q, 1)[0].1
    }
}

/// The engines this kernel offers, by the daemon's names; each one refused says `skipped:`
/// why (a failure under `AIO_REQUIRE_ALL_BACKENDS=1`).
pub fn engines() -> Vec<&'static str> {
    ["uring", "linux-aio", "pool"]
        .into_iter()
        .filter(|e| {
            let kind: aio::EngineKind = e.parse().expect("an engine's name");
            match kind.build(&aio_vhost_user_blk::daemon::engine_options()) {
                Ok(_) => true,
                Err(why) => {
                    aio_core::testing::skip(&format!("engine {e}: {why}"));
                    false
                }
            }
        })
        .collect()
}
