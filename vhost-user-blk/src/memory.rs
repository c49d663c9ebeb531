//! The guest's memory table as vhost-user hands it over: regions of shared memory (memfds)
//! with their guest-physical and frontend-virtual addresses.
//!
//! This module owns mapping and unmapping the regions and translating the frontend's virtual
//! addresses (vring addresses are given that way) to guest-physical ones. Mappings are shared
//! (`Arc`): a table replaced while requests are in flight stays mapped until they complete.

use std::fs::File;
use std::sync::Arc;

use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Why a region could not be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The region is empty, overflows, or overlaps another.
    #[error("bad memory region: {0}")]
    BadRegion(&'static str),
    /// mmap of the region's fd failed.
    #[error("mapping a memory region: {0}")]
    Map(String),
    /// More regions than the device accepts.
    #[error("more than {0} memory regions")]
    TooMany(usize),
}

/// One region: where the guest sees it, where the frontend has it, the mapping.
#[derive(Debug, Clone)]
struct Region {
    guest_addr: u64,
    size: u64,
    frontend_addr: u64,
    mapping: Arc<GuestRegionMmap>,
}

/// The most regions (`VHOST_USER_GET_MAX_MEM_SLOTS`).
pub const MAX_REGIONS: usize = 32;

/// The memory table of one connection.
#[derive(Debug, Default)]
pub struct MemoryTable {
    regions: Vec<Region>,
}

impl MemoryTable {
    /// Maps `size` bytes of `file` from `file_offset`, seen by the guest at `guest_addr` and by
    /// the frontend at `frontend_addr`.
    pub fn add(
        &mut self,
        guest_addr: u64,
        size: u64,
        frontend_addr: u64,
        file: File,
        file_offset: u64,
    ) -> Result<(), MemoryError> {
        if self.regions.len() >= MAX_REGIONS {
            return Err(MemoryError::TooMany(MAX_REGIONS));
        }
        let end = guest_addr.checked_add(size);
        if size == 0 || end.is_none() || frontend_addr.checked_add(size).is_none() {
            return Err(MemoryError::BadRegion("empty or overflowing"));
        }
        let end = end.expect("checked");
        let overlaps = self
            .regions
            .iter()
            .any(|r| guest_addr < r.guest_addr + r.size && r.guest_addr < end);
        if overlaps {
            return Err(MemoryError::BadRegion("overlaps another region"));
        }
        let size_usize = usize::try_from(size)
            .map_err(|_| MemoryError::BadRegion("larger than the address space"))?;
        let mapping = GuestRegionMmap::from_range(
            GuestAddress(guest_addr),
            size_usize,
            Some(FileOffset::new(file, file_offset)),
        )
        .map_err(|e| MemoryError::Map(e.to_string()))?;
        self.regions.push(Region {
            guest_addr,
            size,
            frontend_addr,
            mapping: Arc::new(mapping),
        });
        // vm-memory wants its regions in address order.
        self.regions.sort_by_key(|r| r.guest_addr);
        Ok(())
    }

    /// Removes the region at `guest_addr` of `size` bytes (its mapping goes when no request
    /// holds it any more). False if there is none.
    pub fn remove(&mut self, guest_addr: u64, size: u64) -> bool {
        let before = self.regions.len();
        self.regions
            .retain(|r| !(r.guest_addr == guest_addr && r.size == size));
        self.regions.len() != before
    }

    /// Drops every region.
    pub fn clear(&mut self) {
        self.regions.clear();
    }

    /// How many regions.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The guest-physical address of the frontend's virtual address `addr`, if a region
    /// holds it.
    pub fn frontend_to_guest(&self, addr: u64) -> Option<u64> {
        self.regions
            .iter()
            .find(|r| addr >= r.frontend_addr && addr - r.frontend_addr < r.size)
            .map(|r| r.guest_addr + (addr - r.frontend_addr))
    }

    /// The table as guest memory for the queues (sharing the mappings).
    pub fn guest_memory(&self) -> Result<Arc<GuestMemoryMmap>, MemoryError> {
        let regions = self.regions.iter().map(|r| r.mapping.clone()).collect();
        GuestMemoryMmap::from_arc_regions(regions)
            .map(Arc::new)
            .map_err(|e| MemoryError::Map(e.to_string()))
    }
}
