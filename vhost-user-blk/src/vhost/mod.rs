//! The vhost-user-blk protocol: the frontend's messages turned into queue starts and stops.
//!
//! This module owns one connection's device state as the vhost-user protocol defines it
//! (features, memory table, per-vring size, addresses, base, kick and call fds, enable) and
//! decides when a vring runs. The messages themselves are read and answered by the `vhost`
//! crate's `BackendReqHandler` (each handler is in `messages`), which the daemon drives from a
//! read handler on the socket;
//! the queues run on iothreads, reached through [`IoThreadHandle::call`]. It never touches a
//! ring itself.
//!
//! * A vring runs once it has a size, addresses inside the memory table, a kick fd, and is
//!   enabled (`SET_VRING_ENABLE`, or at once without `VHOST_USER_F_PROTOCOL_FEATURES`).
//! * `GET_VRING_BASE` stops it: the call returns after every request it took has completed.
//! * A new memory table reaches running queues; requests in flight keep the old mappings.
//! * [`BlkBackend::disconnect`] stops every vring (requests complete first) and only then
//!   drops the memory table.
//! * With `VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD` the requests in flight are tracked in the
//!   region the frontend keeps ([`crate::inflight`]): a vring starting on a region a previous
//!   backend used resumes from it (next used = the used ring's index, next avail = that plus
//!   the heads still in flight, which run again first), not from the frontend's vring base,
//!   which after a crash is QEMU's rewind to the used index. A region that contradicts the
//!   ring refuses the vring with an error naming why.
//! * With `VHOST_USER_PROTOCOL_F_LOG_SHMFD` the frontend shares a dirty log
//!   ([`crate::log`], `SET_LOG_BASE`); while `VHOST_F_LOG_ALL` is negotiated every running
//!   queue reports the guest memory it writes there, and its used ring's writes too when its
//!   `SET_VRING_ADDR` had `VHOST_VRING_F_LOG` (at the ring's `log_guest_addr`). Each of
//!   those messages reaches the running queues before it is answered: once the frontend has
//!   the answer, nothing is marked in a log it replaced, and with logging off nothing at all.

use std::fs::File;
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::IoThreadHandle;
use vhost::vhost_user::message::VhostUserVirtioFeatures;
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};
use vhost::vhost_user::{Error as VuError, Result as VuResult};
use virtio_queue::{Queue, QueueT};

use crate::inflight::{InflightError, InflightRegion, RingState};
use crate::log::DirtyLog;
use crate::memory::MemoryTable;
use aio_virtio_blk::dataplane::{iothread_of, DataPlane, QueueSetup};
use aio_virtio_blk::device::{BlockDevice, MAX_QUEUE_SIZE};
use aio_virtio_blk::dirty::DirtyTracking;
use aio_virtio_blk::inflight::Inflight;
use aio_virtio_blk::spec::{bit, feature};

/// The iothreads the disks' queues are spread over ([`iothread_of`]).
pub type IoThreads<L, E> = Arc<Vec<IoThreadHandle<L, DataPlane<L, E>>>>;

/// Which disk of the daemon a connection serves: its number (the key of its queues on the
/// iothreads) and the number of its queue 0 among every disk's queues, numbered in order
/// (where [`iothread_of`] starts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskIndex {
    /// The disk's number (0 for the first `--disk`).
    pub number: u32,
    /// The queues of the disks before it.
    pub first_queue: usize,
    /// The iothread all its queues run on, if it names one (else [`iothread_of`] spreads
    /// them).
    pub iothread: Option<usize>,
}

/// One vring as the frontend set it up.
#[derive(Debug, Default)]
struct Vring {
    size: u16,
    /// Guest-physical addresses of the descriptor table, avail and used rings.
    addrs: Option<(u64, u64, u64)>,
    base: u16,
    kick: Option<File>,
    call: Option<File>,
    enabled: bool,
    running: bool,
    /// Where the used ring's writes are logged (`log_guest_addr`), if the frontend asked
    /// (`VHOST_VRING_F_LOG`).
    log_used: Option<u64>,
}

/// One disk's device state for one connection, driven by the `vhost` crate's request handler.
pub struct BlkBackend<L: EventLoop + 'static, E: IoEngine + 'static> {
    disk: u32,
    first_queue: usize,
    pinned: Option<usize>,
    device: Arc<BlockDevice>,
    iothreads: IoThreads<L, E>,
    acked_features: u64,
    protocol_features: u64,
    memory: MemoryTable,
    vrings: Vec<Vring>,
    /// The in-flight region the frontend handed over (`SET_INFLIGHT_FD`), if any.
    inflight: Option<Arc<InflightRegion>>,
    /// The backend channel the frontend handed over (`SET_BACKEND_REQ_FD`), if any: where a
    /// resize is announced.
    channel: Option<Backend>,
    /// The dirty log the frontend handed over (`SET_LOG_BASE`), if any; queues hold it while
    /// they report to it.
    log: Option<Arc<DirtyLog>>,
}

fn handler_error(message: impl Into<String>) -> VuError {
    VuError::ReqHandlerError(std::io::Error::other(message.into()))
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> BlkBackend<L, E> {
    /// The state of a new connection to disk `disk`.
    pub fn new(disk: DiskIndex, device: Arc<BlockDevice>, iothreads: IoThreads<L, E>) -> Self {
        let queues = device.options().queues as usize;
        BlkBackend {
            disk: disk.number,
            first_queue: disk.first_queue,
            pinned: disk.iothread,
            device,
            iothreads,
            acked_features: 0,
            protocol_features: 0,
            memory: MemoryTable::default(),
            vrings: (0..queues).map(|_| Vring::default()).collect(),
            inflight: None,
            channel: None,
            log: None,
        }
    }

    /// Tells the frontend the config space changed (the disk was resized) with
    /// `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` on the backend channel; it reads the config
    /// again (`GET_CONFIG`) and raises the driver's config interrupt. False when the frontend
    /// gave no channel (it did not take `BACKEND_REQ`): it sees the new size when it next
    /// reads the config (at its next connection).
    ///
    /// The message asks for no ack: QEMU reads the config back before it would ack, and that
    /// `GET_CONFIG` is served by the thread calling this.
    pub fn announce_config_change(&self) -> std::io::Result<bool> {
        let Some(channel) = &self.channel else {
            return Ok(false);
        };
        channel.handle_config_change()?;
        Ok(true)
    }

    fn iothread(&self, index: usize) -> &IoThreadHandle<L, DataPlane<L, E>> {
        let k = match self.pinned {
            Some(k) => k % self.iothreads.len().max(1),
            None => iothread_of(self.first_queue, index, self.iothreads.len()),
        };
        &self.iothreads[k]
    }

    fn vring(&mut self, index: u32) -> VuResult<&mut Vring> {
        self.vrings
            .get_mut(index as usize)
            .ok_or(VuError::InvalidParam)
    }

    /// Stops every vring (each once its requests have completed), then drops the memory
    /// table: the end of a connection.
    pub fn disconnect(&mut self) {
        for index in 0..self.vrings.len() {
            self.stop_vring(index);
        }
        self.memory.clear();
    }

    /// Whether any vring runs.
    pub fn is_running(&self) -> bool {
        self.vrings.iter().any(|v| v.running)
    }

    fn stop_vring(&mut self, index: usize) -> Option<u16> {
        if !self.vrings[index].running {
            return None;
        }
        self.vrings[index].running = false;
        let key = (self.disk, index as u16);
        let next = self
            .iothread(index)
            .call(move |ctx, plane| plane.stop(ctx, key))
            .ok()
            .flatten();
        if let Some(next) = next {
            self.vrings[index].base = next;
        }
        next
    }

    /// Starts the vring if it has everything it needs.
    fn maybe_start(&mut self, index: usize) -> VuResult<()> {
        let protocol = self.acked_features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        let v = &self.vrings[index];
        let ready = !v.running
            && v.size > 0
            && v.addrs.is_some()
            && v.kick.is_some()
            && (v.enabled || !protocol)
            && !self.memory.is_empty();
        if !ready {
            return Ok(());
        }
        let memory = self
            .memory
            .guest_memory()
            .map_err(|e| handler_error(e.to_string()))?;
        let v = &self.vrings[index];
        let (desc, avail, used) = v.addrs.expect("checked");
        let mut queue = Queue::new(MAX_QUEUE_SIZE).map_err(|e| handler_error(e.to_string()))?;
        queue.set_size(v.size);
        queue.set_desc_table_address(Some(desc as u32), Some((desc >> 32) as u32));
        queue.set_avail_ring_address(Some(avail as u32), Some((avail >> 32) as u32));
        queue.set_used_ring_address(Some(used as u32), Some((used >> 32) as u32));
        queue.set_event_idx(self.acked_features & bit(feature::EVENT_IDX) != 0);
        queue.set_next_avail(v.base);
        queue.set_next_used(v.base);
        queue.set_ready(true);
        let kick = v.kick.as_ref().expect("checked").try_clone();
        let call = v.call.as_ref().map(File::try_clone).transpose();
        let (Ok(kick), Ok(call)) = (kick, call) else {
            return Err(handler_error("duplicating the vring's fds"));
        };
        let (size, base) = (v.size, v.base);
        let inflight = match &self.inflight {
            Some(region) => {
                let recovered = self
                    .recover(region, index, &memory, (desc, avail, used), size, base)
                    .map_err(|e| {
                        let message = format!("disk {} queue {index}: {e}", self.disk);
                        eprintln!("aio-vhost-user-blk: {message}; the queue is not started");
                        handler_error(message)
                    })?;
                queue.set_next_avail(recovered.0);
                queue.set_next_used(recovered.1);
                Some(recovered.2)
            }
            None => None,
        };
        let mut setup = QueueSetup::new(self.device.clone(), queue, memory, kick, call);
        if let Some(inflight) = inflight {
            setup = setup.with_inflight(inflight);
        }
        if let Some(dirty) = self.dirty_tracking(index) {
            setup = setup.with_dirty_tracking(dirty);
        }
        let key = (self.disk, index as u16);
        self.iothread(index)
            .call(move |ctx, plane| plane.start(ctx, key, setup).map_err(|e| e.to_string()))
            .map_err(|e| handler_error(e.to_string()))?
            .map_err(handler_error)?;
        self.vrings[index].running = true;
        Ok(())
    }

    /// Recovers vring `index` from its slice of `region` against the ring at `addrs` (desc,
    /// avail, used) in `memory`: its next avail and next used index and its log, with the
    /// heads to resubmit.
    fn recover(
        &self,
        region: &Arc<InflightRegion>,
        index: usize,
        memory: &GuestMemoryMmap,
        (_desc, avail, used): (u64, u64, u64),
        size: u16,
        base: u16,
    ) -> Result<(u16, u16, Inflight), InflightError> {
        let read_u16 = |at: u64| memory.read_obj::<u16>(GuestAddress(at)).map(u16::from_le);
        let (Ok(avail_idx), Ok(used_idx)) = (read_u16(avail + 2), read_u16(used + 2)) else {
            return Err(InflightError::RingUnreadable {
                queue: index as u16,
            });
        };
        let ring = RingState {
            size,
            base,
            avail_idx,
            used_idx,
        };
        // The used ring's element `i`: { id: u32, len: u32 } at used + 4 + 8 * (i % size).
        let used_head = |i: u16| {
            let at = used + 4 + 8 * u64::from(i % size);
            let id = memory.read_obj::<u32>(GuestAddress(at)).ok()?;
            u16::try_from(u32::from_le(id)).ok()
        };
        let got = region.queue(index as u16)?.recover(&ring, used_head)?;
        if !got.resubmit.is_empty() || got.repaired > 0 || got.ignored > 0 {
            eprintln!(
                "aio-vhost-user-blk: disk {} queue {index}: resubmitting {} requests left in \
                 flight (used index {used_idx}, avail index {avail_idx}; {} used elements \
                 repaired, {} entries ignored)",
                self.disk,
                got.resubmit.len(),
                got.repaired,
                got.ignored
            );
        }
        let inflight = Inflight {
            log: Box::new(got.log),
            resubmit: got.resubmit,
        };
        Ok((got.next_avail, got.next_used, inflight))
    }

    /// What vring `index` reports its writes to: the log, while `VHOST_F_LOG_ALL` is
    /// negotiated and there is one.
    fn dirty_tracking(&self, index: usize) -> Option<DirtyTracking> {
        let log_all = self.acked_features & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        let log = self.log.as_ref().filter(|_| log_all)?.clone();
        Some(DirtyTracking::new(log, self.vrings[index].log_used))
    }

    /// Gives the running vrings (only `which`, if given) their dirty logging as it is now;
    /// returns once each has it.
    fn logging_changed(&mut self, which: Option<usize>) -> VuResult<()> {
        for index in 0..self.vrings.len() {
            if !self.vrings[index].running || which.is_some_and(|w| w != index) {
                continue;
            }
            let (key, dirty) = ((self.disk, index as u16), self.dirty_tracking(index));
            self.iothread(index)
                .call(move |_ctx, plane| plane.set_dirty_tracking(key, dirty))
                .map_err(|e| handler_error(e.to_string()))?;
        }
        Ok(())
    }

    /// Hands a new memory table to the running queues.
    fn memory_changed(&mut self) -> VuResult<()> {
        if self.memory.is_empty() || !self.is_running() {
            return Ok(());
        }
        let memory = self
            .memory
            .guest_memory()
            .map_err(|e| handler_error(e.to_string()))?;
        let disk = self.disk;
        // The iothreads this disk's queues run on (not the others: some may have stopped).
        let mut planes: Vec<&IoThreadHandle<L, DataPlane<L, E>>> = Vec::new();
        for index in 0..self.vrings.len() {
            let plane = self.iothread(index);
            if !planes.iter().any(|p| std::ptr::eq(*p, plane)) {
                planes.push(plane);
            }
        }
        for plane in planes {
            let memory = memory.clone();
            plane
                .call(move |_ctx, plane| plane.set_memory(disk, &memory))
                .map_err(|e| handler_error(e.to_string()))?;
        }
        Ok(())
    }
}

mod messages;
