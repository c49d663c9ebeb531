//! The descriptor-chain parser against a hostile driver: the input is the whole guest memory
//! of one queue (descriptor table, avail ring, indirect tables, headers and data, all as the
//! driver wrote them) and the disk's limits. Every chain the ring yields is parsed; nothing may
//! panic, and an accepted request may only name memory inside the table and sectors inside the
//! disk, and may write a read-only disk in no way. Each chain walked from its head (as a
//! request resubmitted after a restart is reached) must be the ring crate's chain, with the
//! same answer.

#![no_main]

use aio_virtio_blk::chain::{descriptors_at, parse_chain, parse_head, BlkOp, ChainLimits};
use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest memory: 64 KiB at address 0.
const MEM: u64 = 0x1_0000;
/// The queue's size, and where its parts lie (the rest is the driver's to fill).
const SIZE: u16 = 16;
const DESC: u64 = 0;
const AVAIL: u64 = 0x100;
const USED: u64 = 0x200;

fuzz_target!(|input: &[u8]| {
    // The first 8 bytes are the disk (its size, read-only); the rest is guest memory.
    let Some((disk, memory)) = input.split_first_chunk::<8>() else {
        return;
    };
    let disk = u64::from_le_bytes(*disk);
    let limits = ChainLimits {
        capacity_sectors: disk >> 1,
        read_only: disk & 1 == 1,
        seg_max: 4,
        size_max: 4096,
        max_discard_sectors: 64,
        max_write_zeroes_sectors: 64,
    };
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
    let len = memory.len().min(MEM as usize);
    mem.write_slice(&memory[..len], GuestAddress(0)).unwrap();

    let mut queue = Queue::new(SIZE).unwrap();
    queue.set_size(SIZE);
    queue.set_desc_table_address(Some(DESC as u32), Some(0));
    queue.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    queue.set_used_ring_address(Some(USED as u32), Some(0));
    queue.set_ready(true);
    // An avail index further ahead than the queue size is refused by the ring crate.
    let Ok(chains) = queue.iter(&mem) else {
        return;
    };
    for chain in chains.take(usize::from(SIZE)) {
        // A chain reached from its head (a request resubmitted after a restart) is the same
        // chain, with the same answer.
        let head = chain.head_index();
        let fields =
            |d: &virtio_queue::desc::split::Descriptor| (d.addr().0, d.len(), d.flags(), d.next());
        let popped: Vec<_> = chain.clone().map(|d| fields(&d)).collect();
        let walked: Vec<_> = descriptors_at(&mem, GuestAddress(DESC), SIZE, head)
            .iter()
            .map(fields)
            .collect();
        assert_eq!(popped, walked, "head {head}");
        let parsed = parse_chain(chain, &mem, &limits);
        assert_eq!(
            parse_head(&mem, GuestAddress(DESC), SIZE, head, &limits),
            parsed
        );
        let Ok(request) = parsed else {
            continue;
        };
        let inside =
            |addr: GuestAddress, len: u64| addr.0.checked_add(len).is_some_and(|end| end <= MEM);
        assert!(inside(request.status, 1), "{request:?}");
        // In u128: a capacity near u64::MAX sectors has more bytes than u64 holds.
        let bytes_on_disk = u128::from(limits.capacity_sectors) * 512;
        let writes = !matches!(
            request.op,
            BlkOp::Read { .. } | BlkOp::Flush | BlkOp::GetId { .. }
        );
        assert!(!(writes && limits.read_only), "{request:?}");
        match &request.op {
            BlkOp::Read { offset, segments } | BlkOp::Write { offset, segments } => {
                let total: u128 = segments.iter().map(|s| u128::from(s.len)).sum();
                assert!(u128::from(*offset) + total <= bytes_on_disk, "{request:?}");
                for s in segments {
                    assert!(inside(s.addr, u64::from(s.len)), "{request:?}");
                }
            }
            BlkOp::Discard { offset, len } | BlkOp::WriteZeroes { offset, len, .. } => {
                assert!(
                    u128::from(*offset) + u128::from(*len) <= bytes_on_disk,
                    "{request:?}"
                );
            }
            BlkOp::GetId { buf } => assert!(inside(buf.addr, u64::from(buf.len)), "{request:?}"),
            BlkOp::Flush => {}
        }
    }
});
