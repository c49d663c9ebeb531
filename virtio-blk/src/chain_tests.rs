//! The chain checks over a mock virtqueue in guest memory: every refusal a hostile driver can
//! provoke, and a bounded random search that the parser never panics nor accepts memory
//! outside the table.

use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;

const MEM: u64 = 0x20_0000;
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x11_0000;
const STATUS: u64 = 0x1f_0000;
const W: u16 = VRING_DESC_F_WRITE as u16;
const N: u16 = VRING_DESC_F_NEXT as u16;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
}

fn limits() -> ChainLimits {
    ChainLimits {
        capacity_sectors: 2048,
        read_only: false,
        seg_max: 4,
        size_max: 65536,
        max_discard_sectors: 1024,
        max_write_zeroes_sectors: 1024,
    }
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

fn header(mem: &GuestMemoryMmap, request_type: u32, sector: u64) {
    mem.write_obj(request_type.to_le(), GuestAddress(HDR))
        .unwrap();
    mem.write_obj(sector.to_le(), GuestAddress(HDR + 8))
        .unwrap();
}

/// Parses the first chain of a queue of 16 whose table holds `descs` (their `next` fields as
/// given, so loops can be built). Also checks that walking the chain from its head (as a
/// resubmitted request is reached) gives the ring crate's descriptors and the same answer.
fn parse_raw(
    mem: &GuestMemoryMmap,
    descs: &[RawDescriptor],
    limits: &ChainLimits,
) -> Result<BlkRequest, RefusedChain> {
    let vq = MockSplitQueue::new(mem, 16);
    vq.add_desc_chains(descs, 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let (table, size) = (GuestAddress(q.desc_table()), q.size());
    let chain = q.iter(mem).unwrap().next().expect("a chain");
    let head = chain.head_index();
    let popped: Vec<(u64, u32, u16, u16)> = chain.clone().map(fields).collect();
    let walked: Vec<_> = descriptors_at(mem, table, size, head)
        .into_iter()
        .map(fields)
        .collect();
    assert_eq!(
        walked, popped,
        "the walk from head {head} differs from the ring's"
    );
    let parsed = parse_chain(chain, mem, limits);
    assert_eq!(parse_head(mem, table, size, head, limits), parsed);
    parsed
}

fn fields(d: Descriptor) -> (u64, u32, u16, u16) {
    (d.addr().0, d.len(), d.flags(), d.next())
}

#[test]
fn a_head_past_the_ring_walks_no_descriptor() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, 16);
    let q: Queue = vq.create_queue().unwrap();
    let table = GuestAddress(q.desc_table());
    assert!(descriptors_at(&mem, table, 16, 16).is_empty());
    let refused = parse_head(&mem, table, 16, 40, &limits()).unwrap_err();
    assert_eq!((refused.head, refused.error), (40, ChainError::Empty));
}

/// As `parse_raw`, with `next` fields linking the descriptors in order.
fn parse(
    mem: &GuestMemoryMmap,
    descs: &[(u64, u32, u16)],
    limits: &ChainLimits,
) -> Result<BlkRequest, RefusedChain> {
    let raw: Vec<_> = descs
        .iter()
        .enumerate()
        .map(|(i, &(a, l, f))| {
            let last = i + 1 == descs.len();
            d(
                a,
                l,
                if last { f } else { f | N },
                if last { 0 } else { i as u16 + 1 },
            )
        })
        .collect();
    parse_raw(mem, &raw, limits)
}

fn error(r: Result<BlkRequest, RefusedChain>) -> ChainError {
    r.expect_err("the chain must be refused").error
}

#[test]
fn a_read_of_several_segments_is_accepted() {
    let mem = memory();
    header(&mem, spec::T_IN, 8);
    let r = parse(
        &mem,
        &[
            (HDR, 16, 0),
            (DATA, 4096, W),
            (DATA + 8192, 512, W),
            (STATUS, 1, W),
        ],
        &limits(),
    )
    .unwrap();
    assert_eq!(r.status, GuestAddress(STATUS));
    let BlkOp::Read { offset, segments } = &r.op else {
        panic!("{r:?}")
    };
    assert_eq!((*offset, segments.len()), (4096, 2));
    assert_eq!(r.written_len(), 4096 + 512 + 1);
}

#[test]
fn writes_flush_get_id_and_ranges_are_accepted() {
    let mem = memory();
    header(&mem, spec::T_OUT, 0);
    assert!(matches!(
        parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 4096, 0), (STATUS, 1, W)],
            &limits()
        )
        .unwrap()
        .op,
        BlkOp::Write { .. }
    ));
    header(&mem, spec::T_FLUSH, 0);
    assert_eq!(
        parse(&mem, &[(HDR, 16, 0), (STATUS, 1, W)], &limits())
            .unwrap()
            .op,
        BlkOp::Flush
    );
    header(&mem, spec::T_GET_ID, 0);
    assert!(matches!(
        parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 20, W), (STATUS, 1, W)],
            &limits()
        )
        .unwrap()
        .op,
        BlkOp::GetId { .. }
    ));
    // A write-zeroes segment with the unmap flag: 8 sectors at sector 16.
    header(&mem, spec::T_WRITE_ZEROES, 0);
    mem.write_obj(16u64.to_le(), GuestAddress(DATA)).unwrap();
    mem.write_obj(8u32.to_le(), GuestAddress(DATA + 8)).unwrap();
    mem.write_obj(
        spec::WRITE_ZEROES_FLAG_UNMAP.to_le(),
        GuestAddress(DATA + 12),
    )
    .unwrap();
    let r = parse(
        &mem,
        &[(HDR, 16, 0), (DATA, 16, 0), (STATUS, 1, W)],
        &limits(),
    )
    .unwrap();
    assert_eq!(
        r.op,
        BlkOp::WriteZeroes {
            offset: 8192,
            len: 4096,
            unmap: true
        }
    );
    // Discard allows no flags.
    header(&mem, spec::T_DISCARD, 0);
    assert!(matches!(
        error(parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 16, 0), (STATUS, 1, W)],
            &limits()
        )),
        ChainError::BadRangeSegment(_)
    ));
    mem.write_obj(0u32, GuestAddress(DATA + 12)).unwrap();
    let r = parse(
        &mem,
        &[(HDR, 16, 0), (DATA, 16, 0), (STATUS, 1, W)],
        &limits(),
    )
    .unwrap();
    assert_eq!(
        r.op,
        BlkOp::Discard {
            offset: 8192,
            len: 4096
        }
    );
}

#[test]
fn an_indirect_table_is_followed() {
    let mem = memory();
    header(&mem, spec::T_IN, 0);
    let table = 0x18_0000;
    let entries = [
        d(HDR, 16, N, 1),
        d(DATA, 4096, W | N, 2),
        d(STATUS, 1, W, 0),
    ];
    for (i, e) in entries.iter().enumerate() {
        mem.write_obj(*e, GuestAddress(table + 16 * i as u64))
            .unwrap();
    }
    let r = parse_raw(
        &mem,
        &[d(table, 48, VRING_DESC_F_INDIRECT as u16, 0)],
        &limits(),
    )
    .unwrap();
    assert!(matches!(r.op, BlkOp::Read { offset: 0, .. }));
    // An indirect table that loops back on itself.
    mem.write_obj(d(STATUS, 1, W | N, 0), GuestAddress(table + 32))
        .unwrap();
    let e = error(parse_raw(
        &mem,
        &[d(table, 48, VRING_DESC_F_INDIRECT as u16, 0)],
        &limits(),
    ));
    assert!(matches!(e, ChainError::Unterminated { .. }), "{e:?}");
}

#[test]
fn chains_that_loop_or_leave_memory_are_refused() {
    let mem = memory();
    header(&mem, spec::T_IN, 0);
    // 0 -> 1 -> 0 -> ...: the walk stops at the queue size with NEXT still set.
    let e = error(parse_raw(
        &mem,
        &[d(HDR, 16, N, 1), d(DATA, 4096, W | N, 0)],
        &limits(),
    ));
    assert!(matches!(e, ChainError::Unterminated { .. }), "{e:?}");
    // `next` past the table.
    let e = error(parse_raw(&mem, &[d(HDR, 16, N, 99)], &limits()));
    assert!(matches!(e, ChainError::Unterminated { .. }), "{e:?}");
    // Data outside guest memory, and an address whose end overflows.
    let e = error(parse(
        &mem,
        &[(HDR, 16, 0), (MEM - 100, 4096, W), (STATUS, 1, W)],
        &limits(),
    ));
    assert!(
        matches!(e, ChainError::OutsideMemory { index: 1, .. }),
        "{e:?}"
    );
    let e = error(parse(
        &mem,
        &[(HDR, 16, 0), (u64::MAX - 10, 4096, W), (STATUS, 1, W)],
        &limits(),
    ));
    assert!(matches!(e, ChainError::OutsideMemory { .. }), "{e:?}");
    let e = error(parse(
        &mem,
        &[(HDR, 16, 0), (DATA, 4096, W), (MEM, 1, W)],
        &limits(),
    ));
    assert!(
        matches!(e, ChainError::OutsideMemory { index: 2, .. }),
        "{e:?}"
    );
}

#[test]
fn headers_statuses_and_directions_are_checked() {
    let mem = memory();
    header(&mem, spec::T_IN, 0);
    let l = limits();
    let bad_header = [(HDR, 15, 0), (DATA, 512, W), (STATUS, 1, W)];
    assert!(matches!(
        error(parse(&mem, &bad_header, &l)),
        ChainError::BadHeader { len: 15, .. }
    ));
    let writable_header = [(HDR, 16, W), (DATA, 512, W), (STATUS, 1, W)];
    assert!(matches!(
        error(parse(&mem, &writable_header, &l)),
        ChainError::BadHeader { .. }
    ));
    let long_status = [(HDR, 16, 0), (DATA, 512, W), (STATUS, 2, W)];
    let r = parse(&mem, &long_status, &l).unwrap_err();
    assert!(matches!(r.error, ChainError::BadStatus { len: 2, .. }));
    assert_eq!(
        r.status, None,
        "no status byte is written into a bad status descriptor"
    );
    let readable_status = [(HDR, 16, 0), (DATA, 512, W), (STATUS, 1, 0)];
    assert!(matches!(
        error(parse(&mem, &readable_status, &l)),
        ChainError::BadStatus { .. }
    ));
    let wrong_direction = [
        (HDR, 16, 0),
        (DATA, 512, W),
        (DATA + 512, 512, 0),
        (STATUS, 1, W),
    ];
    assert_eq!(
        error(parse(&mem, &wrong_direction, &l)),
        ChainError::WrongDirection { index: 2 }
    );
    header(&mem, spec::T_OUT, 0);
    assert_eq!(
        error(parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 512, W), (STATUS, 1, W)],
            &l
        )),
        ChainError::WrongDirection { index: 1 }
    );
}

#[test]
fn ranges_limits_read_only_and_types_are_checked() {
    let mem = memory();
    let l = limits();
    let read = [(HDR, 16, 0), (DATA, 4096, W), (STATUS, 1, W)];
    header(&mem, spec::T_IN, 2047);
    assert!(matches!(
        error(parse(&mem, &read, &l)),
        ChainError::OutOfRange { .. }
    ));
    header(&mem, spec::T_IN, u64::MAX / 256);
    assert!(
        matches!(error(parse(&mem, &read, &l)), ChainError::OutOfRange { .. }),
        "sector * 512 overflows"
    );
    header(&mem, spec::T_IN, 2040);
    assert!(
        parse(&mem, &read, &l).is_ok(),
        "the last 8 sectors are inside"
    );
    header(&mem, spec::T_IN, 0);
    assert!(matches!(
        error(parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 100, W), (STATUS, 1, W)],
            &l
        )),
        ChainError::BadLength { len: 100 }
    ));
    let five = [
        (HDR, 16, 0),
        (DATA, 512, W),
        (DATA + 512, 512, W),
        (DATA + 1024, 512, W),
        (DATA + 1536, 512, W),
        (DATA + 2048, 512, W),
        (STATUS, 1, W),
    ];
    assert_eq!(
        error(parse(&mem, &five, &l)),
        ChainError::TooManySegments { count: 5, max: 4 }
    );
    assert!(matches!(
        error(parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 131072, W), (STATUS, 1, W)],
            &l
        )),
        ChainError::SegmentTooLarge { .. }
    ));
    header(&mem, spec::T_GET_ID, 0);
    assert_eq!(
        error(parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 19, W), (STATUS, 1, W)],
            &l
        )),
        ChainError::IdBufferTooShort { len: 19 }
    );
    let ro = ChainLimits {
        read_only: true,
        ..l
    };
    header(&mem, spec::T_OUT, 0);
    assert_eq!(
        error(parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 512, 0), (STATUS, 1, W)],
            &ro
        )),
        ChainError::ReadOnly
    );
    header(&mem, spec::T_DISCARD, 0);
    assert_eq!(
        error(parse(
            &mem,
            &[(HDR, 16, 0), (DATA, 16, 0), (STATUS, 1, W)],
            &ro
        )),
        ChainError::ReadOnly
    );
    header(&mem, 77, 0);
    let r = parse(&mem, &[(HDR, 16, 0), (STATUS, 1, W)], &l).unwrap_err();
    assert_eq!(
        (r.error.status(), r.status),
        (spec::S_UNSUPP, Some(GuestAddress(STATUS)))
    );
    assert_eq!(ChainError::ReadOnly.status(), spec::S_IOERR);
}

/// xorshift64*: a fixed stream, so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A bounded fuzz of the parser: random tables (addresses in and around memory, lengths,
/// flags, `next` indexes, indirect tables) never panic, and an accepted request names only
/// memory inside the table and sectors inside the disk.
#[test]
fn random_chains_never_panic_nor_reach_outside_memory() {
    let mem = memory();
    let l = limits();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0;
    for _ in 0..3000 {
        let types = [
            spec::T_IN,
            spec::T_OUT,
            spec::T_FLUSH,
            spec::T_GET_ID,
            spec::T_DISCARD,
            spec::T_WRITE_ZEROES,
            99,
        ];
        header(&mem, types[rng.below(7) as usize], rng.below(4096));
        // A range segment at DATA with random values.
        mem.write_obj(rng.next(), GuestAddress(DATA)).unwrap();
        mem.write_obj(rng.next(), GuestAddress(DATA + 8)).unwrap();
        // A well-formed chain (header, data of one direction, status), then a few random
        // mutations of addresses, lengths, flags and links.
        let count = 2 + rng.below(6) as usize;
        let data_flags = if rng.below(2) == 0 { W } else { 0 };
        let mut descs: Vec<(u64, u32, u16, u16)> = (0..count)
            .map(|i| {
                let (addr, len, flags) = match i {
                    0 => (HDR, 16, 0),
                    i if i + 1 == count => (STATUS, 1, W),
                    i => (
                        DATA + 0x1000 * i as u64,
                        512 * (1 + rng.below(8) as u32),
                        data_flags,
                    ),
                };
                let more = i + 1 < count;
                (
                    addr,
                    len,
                    if more { flags | N } else { flags },
                    if more { i as u16 + 1 } else { 0 },
                )
            })
            .collect();
        for _ in 0..rng.below(3) {
            let i = rng.below(count as u64) as usize;
            match rng.below(5) {
                0 => {
                    descs[i].0 = [
                        rng.next(),
                        MEM - rng.below(8192),
                        u64::MAX - rng.below(4096),
                    ][rng.below(3) as usize]
                }
                1 => {
                    descs[i].1 = [rng.next() as u32, 0, 1, 15, 16, 17, 4095][rng.below(7) as usize]
                }
                2 => descs[i].2 ^= [W, N, VRING_DESC_F_INDIRECT as u16][rng.below(3) as usize],
                3 => descs[i].3 = rng.below(32) as u16,
                _ => {}
            }
        }
        let descs: Vec<_> = descs
            .into_iter()
            .map(|(a, l, f, n)| d(a, l, f, n))
            .collect();
        if let Ok(r) = parse_raw(&mem, &descs, &l) {
            accepted += 1;
            assert!(mem.check_range(r.status, 1));
            match &r.op {
                BlkOp::Read { offset, segments } | BlkOp::Write { offset, segments } => {
                    let len: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
                    assert!(offset + len <= l.capacity_sectors * 512);
                    for s in segments {
                        assert!(mem.check_range(s.addr, s.len as usize));
                    }
                }
                BlkOp::Discard { offset, len } | BlkOp::WriteZeroes { offset, len, .. } => {
                    assert!(offset + len <= l.capacity_sectors * 512);
                }
                BlkOp::GetId { buf } => assert!(mem.check_range(buf.addr, buf.len as usize)),
                BlkOp::Flush => {}
            }
        }
    }
    // The search reaches the accepting paths too, not only refusals.
    assert!(accepted > 10, "only {accepted} random chains were accepted");
}

/// Writes a range segment at DATA: `sectors` sectors at `sector` with `flags`.
fn range_segment(mem: &GuestMemoryMmap, sector: u64, sectors: u32, flags: u32) {
    mem.write_obj(sector.to_le(), GuestAddress(DATA)).unwrap();
    mem.write_obj(sectors.to_le(), GuestAddress(DATA + 8))
        .unwrap();
    mem.write_obj(flags.to_le(), GuestAddress(DATA + 12))
        .unwrap();
}

/// The limits are inclusive (exactly `seg_max` segments, a segment of exactly `size_max`, a
/// range of exactly the most sectors are fine; one more is not), a zero-sector range is
/// refused, write-zeroes without the unmap flag does not unmap, and `GET_ID` answers 20 bytes
/// and the status. Each check here was a mutant the other tests missed.
#[test]
fn limits_are_inclusive_and_small_fields_are_right() {
    let mem = memory();
    let l = limits();
    header(&mem, spec::T_IN, 0);
    let four: Vec<_> = (0..4)
        .map(|i| (DATA + 512 * i, 512, W))
        .chain([(STATUS, 1, W)])
        .collect();
    let mut chain = vec![(HDR, 16, 0)];
    chain.extend(four);
    assert!(parse(&mem, &chain, &l).is_ok(), "seg_max segments");
    let exact = [(HDR, 16, 0), (DATA, l.size_max, W), (STATUS, 1, W)];
    assert!(parse(&mem, &exact, &l).is_ok(), "a segment of size_max");
    let seg = [(HDR, 16, 0), (DATA, 16, 0), (STATUS, 1, W)];
    header(&mem, spec::T_WRITE_ZEROES, 0);
    range_segment(&mem, 0, l.max_write_zeroes_sectors, 0);
    let r = parse(&mem, &seg, &l).unwrap();
    let whole = u64::from(l.max_write_zeroes_sectors) * 512;
    assert_eq!(
        r.op,
        BlkOp::WriteZeroes {
            offset: 0,
            len: whole,
            unmap: false
        }
    );
    range_segment(&mem, 0, l.max_write_zeroes_sectors + 1, 0);
    assert!(matches!(
        error(parse(&mem, &seg, &l)),
        ChainError::BadRangeSegment(_)
    ));
    range_segment(&mem, 0, 0, 0);
    assert!(
        matches!(error(parse(&mem, &seg, &l)), ChainError::BadRangeSegment(_)),
        "0 sectors"
    );
    header(&mem, spec::T_DISCARD, 0);
    range_segment(&mem, 0, 0, 0);
    assert!(
        matches!(error(parse(&mem, &seg, &l)), ChainError::BadRangeSegment(_)),
        "0 sectors"
    );
    header(&mem, spec::T_GET_ID, 0);
    let id = parse(&mem, &[(HDR, 16, 0), (DATA, 64, W), (STATUS, 1, W)], &l).unwrap();
    assert_eq!(id.written_len(), 21, "the serial and the status byte");
}
