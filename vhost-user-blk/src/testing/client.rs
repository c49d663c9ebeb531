//! A libblkio client of one vhost-user-blk socket: libblkio's `virtio-blk-vhost-user` driver
//! with its queues started and one memory region (a memfd the daemon maps) for the data.
//!
//! Set-up, as libblkio wants it: `Blkio::new("virtio-blk-vhost-user")`, `path`, `connect`
//! (waited for at most [`ClientConfig::connect_wait`]: libblkio itself waits without a limit),
//! `num-queues` (checked against the device's `max-queues`), `start`, then the region
//! (`alloc_mem_region`, `map_mem_region`).
//!
//! The region is shared with the daemon, which writes the buffers of reads in flight: this
//! client never hands out a reference into it. [`Client::write_buf`], [`Client::fill_buf`] and
//! [`Client::read_buf`] copy; a range a request in flight uses holds whatever bytes are there.

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::Duration;

use blkio::{Blkio, Blkioq, MemoryRegion, ReqFlags};

/// Why a client could not connect, or a request could not be waited for.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// libblkio refused `what`.
    #[error("{what}: {source} ({})", source.errno())]
    Blkio {
        /// What was being done (`connecting to S`, `num-queues`).
        what: String,
        /// libblkio's error.
        #[source]
        source: blkio::Error,
    },
    /// The daemon did not answer the connection in time (a vhost-user-blk daemon serves one
    /// client at a time: is another one connected?).
    #[error(
        "connecting to {}: no answer within {wait:?} (a vhost-user-blk daemon serves one client \
         at a time: is another one connected?)",
        socket.display()
    )]
    NoAnswer {
        /// The socket.
        socket: PathBuf,
        /// How long the client waited.
        wait: Duration,
    },
    /// More queues were asked for than the device has.
    #[error("{asked} queue(s) asked for: the device at {} has {max}", socket.display())]
    TooManyQueues {
        /// The socket.
        socket: PathBuf,
        /// Queues asked for.
        asked: usize,
        /// The device's `max-queues`.
        max: i32,
    },
}

impl From<ClientError> for std::io::Error {
    fn from(e: ClientError) -> std::io::Error {
        let kind = match &e {
            ClientError::Blkio { .. } => std::io::ErrorKind::Other,
            ClientError::NoAnswer { .. } => std::io::ErrorKind::TimedOut,
            ClientError::TooManyQueues { .. } => std::io::ErrorKind::InvalidInput,
        };
        std::io::Error::new(kind, e)
    }
}

/// A libblkio error while doing `what`.
fn blkio_err(what: impl Into<String>) -> impl FnOnce(blkio::Error) -> ClientError {
    let what = what.into();
    move |source| ClientError::Blkio { what, source }
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// Queues to start (libblkio's `num-queues`).
    pub queues: usize,
    /// Bytes of the data region (rounded up to libblkio's `mem-region-alignment`).
    pub region_bytes: usize,
    /// Open the device read-only (libblkio refuses a writable client of a read-only device).
    pub read_only: bool,
    /// The longest wait for the daemon to answer the connection.
    pub connect_wait: Duration,
}

impl ClientConfig {
    /// One queue, a 1 MiB region, writable, a 10 s wait.
    pub fn new(socket: impl Into<PathBuf>) -> ClientConfig {
        ClientConfig {
            socket: socket.into(),
            queues: 1,
            region_bytes: 1 << 20,
            read_only: false,
            connect_wait: Duration::from_secs(10),
        }
    }
}

/// A connected, started libblkio client with its data region.
pub struct Client {
    // Dropped last (fields drop in order): the queues and the region belong to it.
    queues: Vec<Blkioq>,
    region: MemoryRegion,
    blkio: Blkio,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("queues", &self.queues.len())
            .field("region_bytes", &self.region.len)
            .finish()
    }
}

impl Client {
    /// Connects to `config.socket` and starts `config.queues` queues.
    pub fn connect(config: &ClientConfig) -> Result<Client, ClientError> {
        let mut b = connect_within(config)?;
        let max = b
            .get_i32("max-queues")
            .map_err(blkio_err("libblkio: max-queues"))?;
        if config.queues as i64 > i64::from(max) {
            return Err(ClientError::TooManyQueues {
                socket: config.socket.clone(),
                asked: config.queues,
                max,
            });
        }
        b.set_i32("num-queues", config.queues as i32)
            .map_err(blkio_err("libblkio: num-queues"))?;
        let started = b
            .start()
            .map_err(blkio_err(format!("starting {}", config.socket.display())))?;
        let align = b
            .get_u64("mem-region-alignment")
            .map_err(blkio_err("libblkio: mem-region-alignment"))?
            .max(1) as usize;
        let len = config.region_bytes.max(1).div_ceil(align) * align;
        let region = b
            .alloc_mem_region(len)
            .map_err(blkio_err("libblkio: allocating the region"))?;
        if let Err(e) = b.map_mem_region(&region) {
            b.free_mem_region(&region);
            return Err(blkio_err(format!(
                "mapping the region into {}",
                config.socket.display()
            ))(e));
        }
        Ok(Client {
            queues: started.queues,
            region,
            blkio: b,
        })
    }

    /// The device's capacity in bytes.
    pub fn capacity(&self) -> Result<u64, ClientError> {
        self.blkio
            .get_u64("capacity")
            .map_err(blkio_err("libblkio: capacity"))
    }

    /// The device's request alignment in bytes (offsets and lengths are multiples of it).
    pub fn request_alignment(&self) -> Result<u64, ClientError> {
        let a = self
            .blkio
            .get_i32("request-alignment")
            .map_err(blkio_err("libblkio: request-alignment"))?;
        Ok(a.max(1) as u64)
    }

    /// Queue `q`, for requests of every kind (`flush`, `discard`, `do_io`...).
    pub fn queue(&mut self, q: usize) -> &mut Blkioq {
        &mut self.queues[q]
    }

    /// The queues, taken out (to give each its own thread); the client keeps the region and
    /// the connection, and must outlive them.
    pub fn take_queues(&mut self) -> Vec<Blkioq> {
        std::mem::take(&mut self.queues)
    }

    /// The region's address in this process (requests name buffers by address).
    pub fn region_addr(&self) -> usize {
        self.region.addr
    }

    /// The region's length in bytes.
    pub fn region_len(&self) -> usize {
        self.region.len
    }

    /// The address of `len` bytes at `offset` in the region; panics outside it.
    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= self.region.len),
            "{len} bytes at {offset}: outside the region of {} bytes",
            self.region.len
        );
        (self.region.addr + offset) as *mut u8
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_buf(&mut self, offset: usize, data: &[u8]) {
        let to = self.at(offset, data.len());
        // SAFETY: `at` checked the range lies in the region, mapped read-write in this process
        // for as long as `self` lives; no reference into the region exists (this type hands out
        // none), and `data` is our own memory, so the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len()) };
    }

    /// Sets `len` bytes of the region at `offset` to `byte`.
    pub fn fill_buf(&mut self, offset: usize, len: usize, byte: u8) {
        let to = self.at(offset, len);
        // SAFETY: as in `write_buf`: a checked range of the mapped region, no reference to it.
        unsafe { std::ptr::write_bytes(to, byte, len) };
    }

    /// A copy of `len` bytes of the region at `offset`.
    pub fn read_buf(&self, offset: usize, len: usize) -> Vec<u8> {
        let from = self.at(offset, len);
        let mut out = vec![0u8; len];
        // SAFETY: as in `write_buf`: a checked range of the mapped region, copied into a fresh
        // vector of `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(from, out.as_mut_ptr(), len) };
        out
    }

    /// Queues a read of `len` bytes at disk `offset` into the region at `buf_at`.
    pub fn read(&mut self, q: usize, offset: u64, buf_at: usize, len: usize, tag: usize) {
        let ptr = self.at(buf_at, len);
        self.queues[q].read(offset, ptr, len, tag, ReqFlags::empty());
    }

    /// Queues a write of `len` bytes from the region at `buf_at` to disk `offset`.
    pub fn write(&mut self, q: usize, offset: u64, buf_at: usize, len: usize, tag: usize) {
        let ptr = self.at(buf_at, len);
        self.queues[q].write(offset, ptr, len, tag, ReqFlags::empty());
    }

    /// Submits what queue `q` holds and waits for `n` completions (at most `each` for every
    /// one): their `(tag, ret)`. Fewer than `n` when `each` passes without one.
    pub fn wait_for(
        &mut self,
        q: usize,
        n: usize,
        each: Duration,
    ) -> Result<Vec<(usize, i32)>, ClientError> {
        let mut out = Vec::with_capacity(n);
        let mut done: Vec<MaybeUninit<blkio::Completion>> =
            (0..n).map(|_| MaybeUninit::uninit()).collect();
        while out.len() < n {
            let want = n - out.len();
            let mut timeout = each;
            let got = self.queues[q]
                .do_io(&mut done[..want], want, Some(&mut timeout), None)
                .map_err(blkio_err(format!("libblkio: do_io on queue {q}")))?;
            if got == 0 {
                break;
            }
            for c in &done[..got] {
                // SAFETY: do_io initialised the first `got` completions.
                let c = unsafe { c.assume_init_ref() };
                out.push((c.user_data, c.ret));
            }
        }
        Ok(out)
    }

    /// As [`wait_for`](Client::wait_for) with 20 s for each, and a panic when one does not
    /// come: for tests.
    pub fn wait(&mut self, q: usize, n: usize) -> Vec<(usize, i32)> {
        let got = self
            .wait_for(q, n, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            got.len(),
            n,
            "queue {q}: a completion did not come within 20 s"
        );
        got
    }

    /// One request on queue `q` (`submit` queues it), waited for: its `ret`.
    pub fn sync(&mut self, q: usize, submit: impl FnOnce(&mut Blkioq)) -> i32 {
        submit(&mut self.queues[q]);
        self.wait(q, 1)[0].1
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.queues.clear();
        self.blkio.unmap_mem_region(&self.region);
        self.blkio.free_mem_region(&self.region);
    }
}

/// libblkio's driver connected to the socket, or [`ClientError::NoAnswer`] after the wait
/// (the connecting thread is left blocked then, and ends with the process).
fn connect_within(config: &ClientConfig) -> Result<Blkio, ClientError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let socket = config.socket.clone();
    let read_only = config.read_only;
    std::thread::spawn(move || {
        let connected = (|| {
            let mut b = Blkio::new("virtio-blk-vhost-user").map_err(blkio_err("libblkio"))?;
            b.set_bool("read-only", read_only)
                .map_err(blkio_err("libblkio: read-only"))?;
            let path = socket.to_str().unwrap_or_default();
            b.set_str("path", path)
                .map_err(blkio_err("libblkio: path"))?;
            b.connect()
                .map_err(blkio_err(format!("connecting to {path}")))?;
            Ok(b)
        })();
        let _ = tx.send(connected);
    });
    rx.recv_timeout(config.connect_wait).unwrap_or_else(|_| {
        Err(ClientError::NoAnswer {
            socket: config.socket.clone(),
            wait: config.connect_wait,
        })
    })
}
