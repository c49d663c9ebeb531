//! The virtio-blk interface as the driver sees it: request types, status bytes, feature bits
//! and the config space layout (VIRTIO 1.2, section 5.2).
//!
//! This module owns the numbers of the specification, named as this crate uses them and taken
//! from `virtio-bindings` (the kernel's headers), and the byte layout of the config space; it
//! never looks at a queue or a disk.

use virtio_bindings::virtio_blk as blk;

/// A sector: the unit of `sector` in a request header and of the capacity, whatever the
/// disk's logical block size.
pub const SECTOR_SIZE: u64 = 512;
/// The length of a `GET_ID` answer (the serial, NUL-padded, not NUL-terminated when 20 bytes).
pub const ID_BYTES: usize = blk::VIRTIO_BLK_ID_BYTES as usize;
/// The request header: `type` (u32), `reserved` (u32), `sector` (u64), little endian.
pub const HEADER_BYTES: u32 = 16;
/// One discard / write-zeroes segment: `sector` (u64), `num_sectors` (u32), `flags` (u32).
pub const RANGE_SEGMENT_BYTES: u32 = 16;

/// `VIRTIO_BLK_T_IN`: read from the disk into the driver's buffers.
pub const T_IN: u32 = blk::VIRTIO_BLK_T_IN;
/// `VIRTIO_BLK_T_OUT`: write the driver's buffers to the disk.
pub const T_OUT: u32 = blk::VIRTIO_BLK_T_OUT;
/// `VIRTIO_BLK_T_FLUSH`: make every completed write durable.
pub const T_FLUSH: u32 = blk::VIRTIO_BLK_T_FLUSH;
/// `VIRTIO_BLK_T_GET_ID`: the device's serial.
pub const T_GET_ID: u32 = blk::VIRTIO_BLK_T_GET_ID;
/// `VIRTIO_BLK_T_DISCARD`: the ranges may be deallocated.
pub const T_DISCARD: u32 = blk::VIRTIO_BLK_T_DISCARD;
/// `VIRTIO_BLK_T_WRITE_ZEROES`: the ranges read back as zeroes.
pub const T_WRITE_ZEROES: u32 = blk::VIRTIO_BLK_T_WRITE_ZEROES;

/// `VIRTIO_BLK_S_OK`.
pub const S_OK: u8 = blk::VIRTIO_BLK_S_OK as u8;
/// `VIRTIO_BLK_S_IOERR`.
pub const S_IOERR: u8 = blk::VIRTIO_BLK_S_IOERR as u8;
/// `VIRTIO_BLK_S_UNSUPP`.
pub const S_UNSUPP: u8 = blk::VIRTIO_BLK_S_UNSUPP as u8;

/// `VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP`: the zeroed range may be deallocated.
pub const WRITE_ZEROES_FLAG_UNMAP: u32 = blk::VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;

/// Device feature bits (bit numbers).
pub mod feature {
    use virtio_bindings::{virtio_blk as blk, virtio_config, virtio_ring};

    /// `VIRTIO_BLK_F_SIZE_MAX`: `size_max` bounds one segment.
    pub const SIZE_MAX: u32 = blk::VIRTIO_BLK_F_SIZE_MAX;
    /// `VIRTIO_BLK_F_SEG_MAX`: `seg_max` bounds the data segments of a request.
    pub const SEG_MAX: u32 = blk::VIRTIO_BLK_F_SEG_MAX;
    /// `VIRTIO_BLK_F_RO`: the disk is read-only.
    pub const RO: u32 = blk::VIRTIO_BLK_F_RO;
    /// `VIRTIO_BLK_F_BLK_SIZE`: `blk_size` is the logical block size.
    pub const BLK_SIZE: u32 = blk::VIRTIO_BLK_F_BLK_SIZE;
    /// `VIRTIO_BLK_F_FLUSH`: `T_FLUSH` is supported.
    pub const FLUSH: u32 = blk::VIRTIO_BLK_F_FLUSH;
    /// `VIRTIO_BLK_F_MQ`: `num_queues` queues.
    pub const MQ: u32 = blk::VIRTIO_BLK_F_MQ;
    /// `VIRTIO_BLK_F_DISCARD`: `T_DISCARD` is supported.
    pub const DISCARD: u32 = blk::VIRTIO_BLK_F_DISCARD;
    /// `VIRTIO_BLK_F_WRITE_ZEROES`: `T_WRITE_ZEROES` is supported.
    pub const WRITE_ZEROES: u32 = blk::VIRTIO_BLK_F_WRITE_ZEROES;
    /// `VIRTIO_RING_F_INDIRECT_DESC`: indirect descriptor tables.
    pub const INDIRECT_DESC: u32 = virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
    /// `VIRTIO_RING_F_EVENT_IDX`: the used/avail event indexes suppress notifications.
    pub const EVENT_IDX: u32 = virtio_ring::VIRTIO_RING_F_EVENT_IDX;
    /// `VIRTIO_F_VERSION_1`.
    pub const VERSION_1: u32 = virtio_config::VIRTIO_F_VERSION_1;
}

/// The bit of feature number `n`.
pub const fn bit(n: u32) -> u64 {
    1 << n
}

/// The values of the config space (`struct virtio_blk_config`) this device fills in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkConfig {
    /// The size in 512-byte sectors.
    pub capacity: u64,
    /// The largest data segment in bytes.
    pub size_max: u32,
    /// The most data segments in one request.
    pub seg_max: u32,
    /// The logical block size in bytes.
    pub blk_size: u32,
    /// How many queues.
    pub num_queues: u16,
    /// The most sectors in one discard segment.
    pub max_discard_sectors: u32,
    /// The most segments in one discard request.
    pub max_discard_seg: u32,
    /// Discard alignment in sectors.
    pub discard_sector_alignment: u32,
    /// The most sectors in one write-zeroes segment.
    pub max_write_zeroes_sectors: u32,
    /// The most segments in one write-zeroes request.
    pub max_write_zeroes_seg: u32,
    /// Whether write-zeroes may deallocate (honours the unmap flag).
    pub write_zeroes_may_unmap: bool,
}

/// The length of the config space this device exposes (up to `unused1`, 60 bytes).
pub const CONFIG_BYTES: usize = 60;

impl BlkConfig {
    /// The config space, little endian, as the driver reads it.
    pub fn to_bytes(&self) -> [u8; CONFIG_BYTES] {
        let mut b = [0u8; CONFIG_BYTES];
        b[0..8].copy_from_slice(&self.capacity.to_le_bytes());
        b[8..12].copy_from_slice(&self.size_max.to_le_bytes());
        b[12..16].copy_from_slice(&self.seg_max.to_le_bytes());
        // 16..20: geometry, unused (no VIRTIO_BLK_F_GEOMETRY).
        b[20..24].copy_from_slice(&self.blk_size.to_le_bytes());
        // 24..32: topology, unused (no VIRTIO_BLK_F_TOPOLOGY); 32: writeback; 33: unused.
        b[34..36].copy_from_slice(&self.num_queues.to_le_bytes());
        b[36..40].copy_from_slice(&self.max_discard_sectors.to_le_bytes());
        b[40..44].copy_from_slice(&self.max_discard_seg.to_le_bytes());
        b[44..48].copy_from_slice(&self.discard_sector_alignment.to_le_bytes());
        b[48..52].copy_from_slice(&self.max_write_zeroes_sectors.to_le_bytes());
        b[52..56].copy_from_slice(&self.max_write_zeroes_seg.to_le_bytes());
        b[56] = u8::from(self.write_zeroes_may_unmap);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layout_matches_the_kernels_struct() {
        let c = BlkConfig {
            capacity: 0x0102_0304_0506_0708,
            size_max: 9,
            seg_max: 10,
            blk_size: 4096,
            num_queues: 3,
            max_discard_sectors: 11,
            max_discard_seg: 1,
            discard_sector_alignment: 8,
            max_write_zeroes_sectors: 12,
            max_write_zeroes_seg: 1,
            write_zeroes_may_unmap: true,
        };
        let b = c.to_bytes();
        // Offsets from linux/virtio_blk.h (struct virtio_blk_config).
        assert_eq!(&b[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 10);
        assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 4096);
        assert_eq!(u16::from_le_bytes(b[34..36].try_into().unwrap()), 3);
        assert_eq!(u32::from_le_bytes(b[48..52].try_into().unwrap()), 12);
        assert_eq!(b[56], 1);
        // The bindings' own layout agrees on the offsets we use.
        use blk::virtio_blk_config as K;
        assert_eq!(std::mem::offset_of!(K, num_queues), 34);
        assert_eq!(std::mem::offset_of!(K, write_zeroes_may_unmap), 56);
        assert_eq!(std::mem::offset_of!(K, max_discard_sectors), 36);
    }
}
