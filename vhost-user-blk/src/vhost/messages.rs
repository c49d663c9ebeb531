//! The frontend's messages, one handler each, as the `vhost` crate's request handler calls
//! them: what each sets in a connection's [`BlkBackend`], and the replies.
//!
//! This module owns the protocol's answers (features offered, the config space, the in-flight
//! region and the dirty log handed over, the memory table's changes); when a vring runs is
//! `super`'s.

use std::fs::File;
use std::sync::Arc;

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVirtioFeatures,
    VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::Backend;
use vhost::vhost_user::VhostUserBackendReqHandlerMut;
use vhost::vhost_user::{Error as VuError, GpuBackend, Result as VuResult};
use vhost::VhostUserMemoryRegionBase;

use super::{handler_error, BlkBackend, Vring};
use crate::inflight::InflightRegion;
use crate::log::DirtyLog;
use crate::memory::{MemoryTable, MAX_REGIONS};
use aio_virtio_blk::device::MAX_QUEUE_SIZE;

fn unsupported<T>(what: &'static str) -> VuResult<T> {
    Err(VuError::InvalidOperation(what))
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> VhostUserBackendReqHandlerMut
    for BlkBackend<L, E>
{
    fn set_owner(&mut self) -> VuResult<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        self.disconnect();
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        self.disconnect();
        self.vrings.iter_mut().for_each(|v| *v = Vring::default());
        // The frontend asks for a new region after a reset, and sends a new log.
        self.inflight = None;
        self.log = None;
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        let vhost_user =
            VhostUserVirtioFeatures::PROTOCOL_FEATURES | VhostUserVirtioFeatures::LOG_ALL;
        Ok(self.device.features() | vhost_user.bits())
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        if features & !self.get_features()? != 0 {
            return Err(VuError::InvalidParam);
        }
        let log_all = VhostUserVirtioFeatures::LOG_ALL.bits();
        let toggled = (self.acked_features ^ features) & log_all != 0;
        self.acked_features = features;
        // QEMU turns logging on at a migration's start, on running queues, and waits for the
        // answer before it relies on the log.
        if toggled {
            self.logging_changed(None)?;
        }
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        regions: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        if regions.len() != files.len() {
            return Err(VuError::InvalidParam);
        }
        let mut table = MemoryTable::default();
        for (r, f) in regions.iter().zip(files) {
            table
                .add(
                    r.guest_phys_addr,
                    r.memory_size,
                    r.user_addr,
                    f,
                    r.mmap_offset,
                )
                .map_err(|e| handler_error(e.to_string()))?;
        }
        self.memory = table;
        self.memory_changed()?;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        if num == 0 || num > u32::from(MAX_QUEUE_SIZE) || !num.is_power_of_two() {
            return Err(VuError::InvalidParam);
        }
        self.vring(index)?.size = num as u16;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        log: u64,
    ) -> VuResult<()> {
        let translate = |a| {
            self.memory
                .frontend_to_guest(a)
                .ok_or(VuError::InvalidParam)
        };
        let addrs = (
            translate(descriptor)?,
            translate(available)?,
            translate(used)?,
        );
        let log_used = flags
            .contains(VhostUserVringAddrFlags::VHOST_VRING_F_LOG)
            .then_some(log);
        let v = self.vring(index)?;
        v.addrs = Some(addrs);
        // At a migration's start the frontend sets a running ring's addresses again, with
        // the log flag (the addresses are the same).
        if std::mem::replace(&mut v.log_used, log_used) != log_used {
            self.logging_changed(Some(index as usize))?;
        }
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        let base = u16::try_from(base).map_err(|_| VuError::InvalidParam)?;
        self.vring(index)?.base = base;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        self.vring(index)?;
        self.stop_vring(index as usize);
        let v = &mut self.vrings[index as usize];
        // The frontend sets the ring up again from scratch.
        v.kick = None;
        v.enabled = false;
        Ok(VhostUserVringState::new(index, u32::from(v.base)))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let index = u32::from(index);
        self.vring(index)?;
        self.stop_vring(index as usize);
        self.vring(index)?.kick = fd;
        self.maybe_start(index as usize)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let index = u32::from(index);
        let running = self.vring(index)?.running;
        if running {
            let call = fd
                .as_ref()
                .map(File::try_clone)
                .transpose()
                .map_err(VuError::ReqHandlerError)?;
            let key = (self.disk, index as u16);
            self.iothread(index as usize)
                .call(move |_ctx, plane| plane.set_call(key, call))
                .map_err(|e| handler_error(e.to_string()))?;
        }
        self.vring(index)?.call = fd;
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, _fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?;
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::INFLIGHT_SHMFD
            | VhostUserProtocolFeatures::LOG_SHMFD)
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        self.protocol_features = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        Ok(self.vrings.len() as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        self.vring(index)?.enabled = enable;
        if enable {
            self.maybe_start(index as usize)
        } else {
            self.stop_vring(index as usize);
            Ok(())
        }
    }

    fn get_config(
        &mut self,
        offset: u32,
        size: u32,
        _flags: VhostUserConfigFlags,
    ) -> VuResult<Vec<u8>> {
        let config = self.device.config().to_bytes();
        let start = offset as usize;
        let end = start
            .checked_add(size as usize)
            .ok_or(VuError::InvalidParam)?;
        // Bytes past our layout read as zero (fields of features not offered).
        let mut out = vec![0u8; size as usize];
        if start < config.len() {
            let have = end.min(config.len());
            out[..have - start].copy_from_slice(&config[start..have]);
        }
        Ok(out)
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> VuResult<()> {
        // The writeback field needs CONFIG_WCE, which is not offered: nothing is writable.
        unsupported("the config space is read-only")
    }

    fn set_backend_req_fd(&mut self, channel: Backend) {
        // No REPLY_ACK on it (see `announce_config_change`).
        self.channel = Some(channel);
    }

    fn set_gpu_socket(&mut self, _gpu: GpuBackend) -> VuResult<()> {
        unsupported("not a GPU device")
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> VuResult<File> {
        unsupported("no shared objects")
    }

    fn get_inflight_fd(
        &mut self,
        asked: &VhostUserInflight,
    ) -> VuResult<(VhostUserInflight, File)> {
        let (queues, queue_size) = (asked.num_queues, asked.queue_size);
        let (size, file) = InflightRegion::create(queues, queue_size).map_err(|e| {
            eprintln!("aio-vhost-user-blk: disk {}: {e}", self.disk);
            VuError::ReqHandlerError(e.into())
        })?;
        Ok((VhostUserInflight::new(size, 0, queues, queue_size), file))
    }

    fn set_inflight_fd(&mut self, given: &VhostUserInflight, file: File) -> VuResult<()> {
        if given.mmap_size == 0 {
            // The frontend tracks nothing.
            self.inflight = None;
            return Ok(());
        }
        let region = InflightRegion::map(
            &file,
            given.mmap_offset,
            given.mmap_size,
            given.num_queues,
            given.queue_size,
        )
        .map_err(|e| {
            eprintln!("aio-vhost-user-blk: disk {}: {e}", self.disk);
            VuError::ReqHandlerError(e.into())
        })?;
        self.inflight = Some(Arc::new(region));
        Ok(())
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        Ok(MAX_REGIONS as u64)
    }

    fn add_mem_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
        fd: File,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        self.memory
            .add(
                region.guest_phys_addr,
                region.memory_size,
                region.user_addr,
                fd,
                region.mmap_offset,
            )
            .map_err(|e| handler_error(e.to_string()))?;
        self.memory_changed()?;
        Ok(None)
    }

    fn remove_mem_region(&mut self, region: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        if !self
            .memory
            .remove(region.guest_phys_addr, region.memory_size)
        {
            return Err(VuError::InvalidParam);
        }
        self.memory_changed()
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> VuResult<Option<File>> {
        unsupported("DEVICE_STATE is not offered")
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        unsupported("DEVICE_STATE is not offered")
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        unsupported("SHMEM is not offered")
    }

    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> VuResult<()> {
        // The `vhost` crate answers once this returns (the frontend waits for the answer under
        // `LOG_SHMFD`), and has no answer for a failure: a log that cannot be mapped ends the
        // connection (`InvalidMessage`), rather than leave the frontend waiting or migrating
        // with pages unlogged.
        let mapped = DirtyLog::map(&file, log.mmap_offset, log.mmap_size).map_err(|e| {
            eprintln!("aio-vhost-user-blk: disk {}: {e}", self.disk);
            VuError::InvalidMessage
        })?;
        // The old log goes once no queue reports to it: every running queue is given the new
        // one before the answer.
        self.log = Some(Arc::new(mapped));
        self.logging_changed(None)
    }
}
