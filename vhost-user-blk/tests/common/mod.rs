//! A vhost-user frontend and its guest in this process: guest RAM in a memfd at a
//! guest-physical address apart from the frontend's own (as QEMU's `memory-backend-memfd`),
//! one disk served on a socket by `DiskSocket` on a control loop with one iothread, and
//! `aio-virtio-blk`'s split-ring driver as the guest's driver of its queue 0. The frontend is
//! the `vhost` crate's; it does not wait for the backend to handle a message that has no
//! reply, so [`Vm::sync`] makes a round trip (`GET_FEATURES`, as QEMU does without
//! `REPLY_ACK`) before a test relies on one.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use aio::poll::PollLoop;
use aio::pool::{PoolConfig, ThreadPool};
use aio_loop::{AioContext, IoThread};
use aio_vhost_user_blk::server::DiskSocket;
use aio_vhost_user_blk::vhost::DiskIndex;
use aio_virtio_blk::dataplane::DataPlane;
use aio_virtio_blk::device::{BlockDevice, DiskOptions};
use aio_virtio_blk::driver::{DriverRequest, Finished, SplitRingDriver};
use aio_virtio_blk::spec;
use vhost::vhost_user::message::{
    VhostUserProtocolFeatures, VhostUserVirtioFeatures, VhostUserVringAddrFlags,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

/// Where the guest's RAM starts, guest-physically: not 0, so that a backend logging offsets
/// or its own addresses instead of guest-physical ones is caught.
pub const GPA: u64 = 0x4000_0000;
/// The guest's RAM.
pub const RAM: u64 = 256 << 10;
/// A log that covers every guest page (one bit each), and no more.
pub const LOG_BYTES: u64 = (GPA + RAM) / 4096 / 8;
/// The queue's size and slots; each slot's buffer of 8 KiB starts 2 KiB into a page, so it
/// spans three pages.
pub const QUEUE_SIZE: u16 = 16;
pub const SLOTS: u16 = 4;
pub const DATA_BYTES: u32 = 8192;
pub const DATA_OFFSET: u32 = 2048;
/// `VHOST_F_LOG_ALL`.
pub const LOG_ALL: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();

type Plane = DataPlane<PollLoop, ThreadPool>;
type Socket = RefCell<Option<Rc<DiskSocket<PollLoop, ThreadPool>>>>;

/// The backend: a disk's socket on a control loop, its queues on one iothread.
pub struct Backend {
    dir: tempfile::TempDir,
    pub socket: PathBuf,
    control: Option<IoThread<PollLoop, Socket>>,
    _iothread: IoThread<PollLoop, Plane>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        // The socket (and the connection's queues) go on the control thread, before the
        // iothread stops.
        if let Some(control) = self.control.take() {
            let _ = control.call(|ctx, socket| {
                if let Some(socket) = socket.borrow_mut().take() {
                    socket.close(ctx);
                }
            });
            let _ = control.stop();
        }
    }
}

fn memfd(name: &std::ffi::CStr, size: u64) -> File {
    // SAFETY: a NUL-terminated name and flags; the fd is checked, then owned by the `File`.
    let file = unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        File::from_raw_fd(fd)
    };
    file.set_len(size).unwrap();
    file
}

/// Serves a 1 MiB raw image, each 4 KiB block filled with its number.
pub fn backend() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i / 4096) as u8).collect();
    std::fs::write(&image, bytes).unwrap();
    let options = DiskOptions {
        serial: "dirty-log".into(),
        ..DiskOptions::default()
    };
    let device = Arc::new(BlockDevice::open(&image, options).unwrap());
    let iothread = IoThread::spawn("iothread0", || {
        let ctx = AioContext::new(PollLoop::new()).map_err(io::Error::from)?;
        let engine = ThreadPool::new(PoolConfig::default()).map_err(io::Error::other)?;
        let plane = DataPlane::new(&ctx, engine).map_err(io::Error::from)?;
        Ok::<_, io::Error>((ctx, plane))
    })
    .unwrap();
    let control = IoThread::spawn("control", || {
        let ctx = AioContext::new(PollLoop::new()).map_err(io::Error::from)?;
        Ok::<_, io::Error>((ctx, Socket::default()))
    })
    .unwrap();
    let socket = dir.path().join("disk.sock");
    let (path, iothreads) = (socket.clone(), Arc::new(vec![iothread.handle()]));
    let disk = DiskIndex {
        number: 0,
        first_queue: 0,
        iothread: None,
    };
    control
        .call(move |ctx, slot| {
            let served = DiskSocket::serve(ctx, disk, &path, device, iothreads)?;
            *slot.borrow_mut() = Some(served);
            Ok::<_, io::Error>(())
        })
        .unwrap()
        .unwrap();
    Backend {
        dir,
        socket,
        control: Some(control),
        _iothread: iothread,
    }
}

/// What a frontend negotiates at its start.
#[derive(Clone, Copy)]
pub struct Setup {
    /// `VHOST_F_LOG_ALL` acked.
    pub log_all: bool,
    /// `VHOST_VRING_F_LOG` in queue 0's `SET_VRING_ADDR`.
    pub vring_log: bool,
}

/// A connected frontend, its guest's memory and the driver of queue 0.
pub struct Vm {
    pub frontend: Frontend,
    pub driver: SplitRingDriver,
    features: u64,
    /// Where the frontend maps the guest's RAM (its "user" addresses).
    user_base: u64,
    _ram: File,
}

impl Vm {
    /// Connects to `backend`, hands over the guest's memory and starts queue 0 as `setup`
    /// says.
    pub fn connect(backend: &Backend, setup: Setup) -> Vm {
        let ram = memfd(c"guest-ram", RAM);
        let region = FileOffset::new(ram.try_clone().unwrap(), 0);
        let memory = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(GPA),
            RAM as usize,
            Some(region),
        )])
        .unwrap();
        let user_base = memory.get_host_address(GuestAddress(GPA)).unwrap() as u64;
        let (driver, side) = SplitRingDriver::in_memory(
            Arc::new(memory),
            GuestAddress(GPA),
            QUEUE_SIZE,
            SLOTS,
            DATA_BYTES,
            DATA_OFFSET,
        )
        .unwrap();

        let mut frontend = Frontend::connect(&backend.socket, 1).unwrap();
        frontend.set_owner().unwrap();
        let offered = frontend.get_features().unwrap();
        assert_ne!(
            offered & LOG_ALL,
            0,
            "VHOST_F_LOG_ALL offered: {offered:#x}"
        );
        // The driver keeps no used event (no `VIRTIO_RING_F_EVENT_IDX`).
        let features = offered & !LOG_ALL & !(1 << spec::feature::EVENT_IDX);
        frontend
            .set_features(features | if setup.log_all { LOG_ALL } else { 0 })
            .unwrap();
        let protocol = frontend.get_protocol_features().unwrap();
        assert!(
            protocol.contains(VhostUserProtocolFeatures::LOG_SHMFD),
            "{protocol:?}"
        );
        frontend
            .set_protocol_features(VhostUserProtocolFeatures::LOG_SHMFD)
            .unwrap();
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: GPA,
            memory_size: RAM,
            userspace_addr: user_base,
            mmap_offset: 0,
            mmap_handle: ram.as_raw_fd(),
        };
        frontend.set_mem_table(&[region]).unwrap();
        let mut vm = Vm {
            frontend,
            driver,
            features,
            user_base,
            _ram: ram,
        };
        vm.frontend.set_vring_num(0, QUEUE_SIZE).unwrap();
        vm.set_vring_addr(setup.vring_log);
        vm.frontend.set_vring_base(0, 0).unwrap();
        // SAFETY: each fd is a duplicate of the driver's eventfd, owned by `side` and given
        // up here, so the `EventFd` is its only owner.
        let (kick, call) = unsafe {
            (
                EventFd::from_raw_fd(side.kick.into_raw_fd()),
                EventFd::from_raw_fd(side.call.into_raw_fd()),
            )
        };
        vm.frontend.set_vring_call(0, &call).unwrap();
        vm.frontend.set_vring_kick(0, &kick).unwrap();
        vm.frontend.set_vring_enable(0, true).unwrap();
        vm.sync();
        vm
    }

    /// The virtio features acked, `VHOST_F_LOG_ALL` left out.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Returns once the backend has handled every message sent before.
    pub fn sync(&self) {
        self.frontend.get_features().unwrap();
    }

    /// The frontend's address of guest-physical `gpa`.
    fn user(&self, gpa: GuestAddress) -> u64 {
        self.user_base + (gpa.0 - GPA)
    }

    /// `SET_VRING_ADDR` of queue 0, with `VHOST_VRING_F_LOG` (the used ring logged at its
    /// guest-physical address, as QEMU gives it) or without.
    pub fn set_vring_addr(&self, log: bool) {
        let (desc, avail, used) = self.driver.ring_addrs();
        let flags = if log {
            VhostUserVringAddrFlags::VHOST_VRING_F_LOG.bits()
        } else {
            0
        };
        let config = VringConfigData {
            queue_max_size: QUEUE_SIZE,
            queue_size: QUEUE_SIZE,
            flags,
            desc_table_addr: self.user(desc),
            used_ring_addr: self.user(used),
            avail_ring_addr: self.user(avail),
            log_addr: log.then_some(used.0),
        };
        self.frontend.set_vring_addr(0, &config).unwrap();
    }

    /// Turns logging on or off as QEMU does at a migration's start and end: `SET_FEATURES`,
    /// then every ring's `SET_VRING_ADDR`; returns once both are handled.
    pub fn set_logging(&self, on: bool) {
        self.frontend
            .set_features(self.features | if on { LOG_ALL } else { 0 })
            .unwrap();
        self.set_vring_addr(on);
        self.sync();
    }

    /// A new log of `bytes` bytes handed over with `SET_LOG_BASE` (the frontend waits for
    /// its answer).
    pub fn set_log(&self, bytes: u64) -> vhost::Result<File> {
        let log = memfd(c"dirty-log", bytes);
        self.set_log_file(&log, bytes)?;
        Ok(log)
    }

    /// `SET_LOG_BASE` with `size` bytes of `log`.
    pub fn set_log_file(&self, log: &File, size: u64) -> vhost::Result<()> {
        let region = VhostUserDirtyLogRegion {
            mmap_size: size,
            mmap_offset: 0,
            mmap_handle: log.as_raw_fd(),
        };
        self.frontend.set_log_base(0, Some(region))
    }

    /// Posts `request` in `slot`, kicks, and waits for its completion.
    pub fn run(&mut self, slot: u16, request: DriverRequest) -> Finished {
        self.driver.post(slot, request).unwrap();
        self.driver.notify().unwrap();
        let mut done = Vec::new();
        // The bound only turns a lost completion into a failure instead of a hang.
        for _ in 0..100 {
            self.driver
                .wait_interrupt(Some(Duration::from_secs(1)))
                .unwrap();
            self.driver.take_used(&mut done).unwrap();
            if let Some(finished) = done.pop() {
                return finished;
            }
        }
        panic!("slot {slot}: {request:?} never completed");
    }

    /// The pages of slot `slot`'s first `len` data bytes.
    pub fn data_pages(&self, slot: u16, len: u32) -> BTreeSet<u64> {
        pages_of(self.driver.data_addr(slot).0, u64::from(len))
    }

    /// The page of slot `slot`'s status byte.
    pub fn status_pages(&self, slot: u16) -> BTreeSet<u64> {
        pages_of(self.driver.status_addr(slot).0, 1)
    }

    /// The pages of the used ring's element `i` and of its index.
    pub fn used_pages(&self, i: u16) -> BTreeSet<u64> {
        let used = self.driver.ring_addrs().2 .0;
        let element = used + 4 + 8 * u64::from(i % QUEUE_SIZE);
        let mut pages = pages_of(element, 8);
        pages.extend(pages_of(used + 2, 2));
        pages
    }
}

/// The pages a write of `len` bytes at `addr` touches.
pub fn pages_of(addr: u64, len: u64) -> BTreeSet<u64> {
    if len == 0 {
        return BTreeSet::new();
    }
    (addr / 4096..=(addr + len - 1) / 4096).collect()
}

/// The pages whose bits are set in `log`, as the frontend reads them.
pub fn marked(log: &File) -> BTreeSet<u64> {
    let mut bytes = vec![0u8; log.metadata().unwrap().len() as usize];
    log.read_exact_at(&mut bytes, 0).unwrap();
    (0..bytes.len() as u64 * 8)
        .filter(|p| bytes[(p / 8) as usize] & (1 << (p % 8)) != 0)
        .collect()
}

/// Clears `log`, as the frontend does when it has read it (no write of the backend's is in
/// flight then: every request run has completed).
pub fn clear(log: &File) {
    let len = log.metadata().unwrap().len() as usize;
    log.write_all_at(&vec![0u8; len], 0).unwrap();
}

/// The union of `sets`.
pub fn union<const N: usize>(sets: [BTreeSet<u64>; N]) -> BTreeSet<u64> {
    sets.into_iter().flatten().collect()
}
