//! A queue served on a real context and engine, over a mock virtqueue: bad chains answered
//! and the next request served, one interrupt per batch, notifications off in polling mode.

use std::fs::File;
use std::io::Write;

use aio::poll::PollLoop;
use aio::pool::{PoolConfig, ThreadPool};
use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Address, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::device::DiskOptions;
use crate::spec;

const W: u16 = VRING_DESC_F_WRITE as u16;
const N: u16 = VRING_DESC_F_NEXT as u16;
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x11_0000;
const STATUS: u64 = 0x1f_0000;

fn eventfd() -> File {
    crate::driver::eventfd().unwrap()
}

fn counter(f: &File) -> u64 {
    let mut v = [0u8; 8];
    // SAFETY: reads 8 bytes into a local array from an eventfd we own.
    let n = unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(f), v.as_mut_ptr().cast(), 8) };
    if n == 8 {
        u64::from_ne_bytes(v)
    } else {
        0
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    device: Arc<BlockDevice>,
}

fn fixture() -> Fixture {
    let dir = aio_test_support::images::memory_dir("virtio-blk-test");
    let path = dir.path().join("img");
    let mut f = File::create(&path).unwrap();
    let pattern: Vec<u8> = (0..1 << 20).map(|i: u32| (i / 4096) as u8 ^ 0x5a).collect();
    f.write_all(&pattern).unwrap();
    let device = BlockDevice::open(&path, DiskOptions::default()).unwrap();
    Fixture {
        _dir: dir,
        device: Arc::new(device),
    }
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

/// A read of one 4 KiB block at `sector` as descriptors `at..at+3`, its status at `status`.
fn read_chain(at: u16, data: u64, status: u64) -> [RawDescriptor; 3] {
    [
        d(HDR, 16, N, at + 1),
        d(data, 4096, W | N, at + 2),
        d(status, 1, W, 0),
    ]
}

fn used(
    mem: &GuestMemoryMmap,
    vq: &MockSplitQueue<GuestMemoryMmap>,
) -> (u16, u16, Vec<(u32, u32)>) {
    let base = vq.used_addr();
    let flags: u16 = mem.read_obj(base).unwrap();
    let idx: u16 = mem.read_obj(base.unchecked_add(2)).unwrap();
    let entries = (0..idx)
        .map(|i| {
            let e = base.unchecked_add(4 + 8 * u64::from(i));
            (
                mem.read_obj(e).unwrap(),
                mem.read_obj(e.unchecked_add(4)).unwrap(),
            )
        })
        .collect();
    (flags, idx, entries)
}

type TestQueue = VirtioBlkQueue<PollLoop, ThreadPool>;

/// Serves `vq` on a new context with a thread pool; the reader end of the call eventfd.
fn serve(
    fx: &Fixture,
    mem: &GuestMemory,
    vq: &MockSplitQueue<GuestMemoryMmap>,
) -> (AioContext<PollLoop>, TestQueue, File) {
    let queue: Queue = vq.create_queue().unwrap();
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let engine = ctx
        .attach_engine(ThreadPool::new(PoolConfig::default()).unwrap(), |_, _| {})
        .unwrap();
    let (kick, call) = (eventfd(), eventfd());
    let call_reader = call.try_clone().unwrap();
    let q = VirtioBlkQueue::start(
        &ctx,
        engine,
        fx.device.clone(),
        queue,
        mem.clone(),
        kick,
        Some(call),
    )
    .unwrap();
    (ctx, q, call_reader)
}

#[test]
fn a_bad_chain_is_answered_and_the_next_request_served() {
    let fx = fixture();
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap());
    let vq = MockSplitQueue::new(&*mem, 16);
    // Chain 0: a header of 15 bytes. Chain 3: a read of block 2 (sector 16).
    mem.write_obj(spec::T_IN, GuestAddress(HDR)).unwrap();
    mem.write_obj(16u64, GuestAddress(HDR + 8)).unwrap();
    let mut descs = vec![
        d(HDR, 15, N, 1),
        d(DATA + 8192, 512, W | N, 2),
        d(STATUS + 8, 1, W, 0),
    ];
    descs.extend(read_chain(3, DATA, STATUS));
    vq.add_desc_chains(&descs, 0).unwrap();
    let (ctx, q, call_reader) = serve(&fx, &mem, &vq);
    for _ in 0..1000 {
        if used(&mem, &vq).1 == 2 {
            break;
        }
        ctx.poll(true);
    }
    let (_, idx, entries) = used(&mem, &vq);
    assert_eq!(idx, 2, "both chains are returned");
    assert_eq!(
        entries,
        vec![(0, 1), (3, 4097)],
        "the bad chain first, with its status byte only"
    );
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(STATUS + 8)).unwrap(),
        spec::S_IOERR
    );
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        spec::S_OK
    );
    let mut block = vec![0u8; 4096];
    mem.read_slice(&mut block, GuestAddress(DATA)).unwrap();
    assert!(
        block.iter().all(|&b| b == 2 ^ 0x5a),
        "the read brought block 2"
    );
    let stats = q.stats();
    assert_eq!((stats.requests, stats.refused), (2, 1));
    assert!(counter(&call_reader) >= 1, "the driver was interrupted");
    assert_eq!(q.stop(&ctx), 2, "the next avail index");
}

#[test]
fn completions_of_one_batch_raise_one_interrupt() {
    let fx = fixture();
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap());
    let vq = MockSplitQueue::new(&*mem, 16);
    // Four GET_ID requests: each completes inside the kick's processing, in one batch.
    mem.write_obj(spec::T_GET_ID, GuestAddress(HDR)).unwrap();
    let descs: Vec<_> = (0..4u16)
        .flat_map(|i| {
            let at = 3 * i;
            [
                d(HDR, 16, N, at + 1),
                d(DATA + 64 * u64::from(i), 20, W | N, at + 2),
                d(STATUS + u64::from(i), 1, W, 0),
            ]
        })
        .collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let (ctx, q, call_reader) = serve(&fx, &mem, &vq);
    assert_eq!(used(&mem, &vq).1, 4);
    assert_eq!(
        counter(&call_reader),
        1,
        "one interrupt for the batch of four"
    );
    assert_eq!(q.stats().interrupts, 1);
    let mut id = [0u8; 20];
    mem.read_slice(&mut id, GuestAddress(DATA + 64)).unwrap();
    assert_eq!(id, fx.device.id_bytes());
    q.stop(&ctx);
}

/// A device that died after publishing used elements and before their interrupt left the
/// driver waiting: a new queue with nothing to do still raises the call eventfd once.
#[test]
fn a_queue_start_interrupts_the_driver_once_even_with_nothing_to_do() {
    let fx = fixture();
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap());
    let vq = MockSplitQueue::new(&*mem, 16);
    let (ctx, q, call_reader) = serve(&fx, &mem, &vq);
    assert_eq!(used(&mem, &vq).1, 0, "nothing was taken");
    assert_eq!(counter(&call_reader), 1, "one interrupt at the start");
    assert_eq!(q.stats().interrupts, 1);
    q.stop(&ctx);
}

#[test]
fn polling_mode_turns_the_drivers_kicks_off_and_on() {
    let fx = fixture();
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap());
    let vq = MockSplitQueue::new(&*mem, 16);
    let (ctx, q, _call) = serve(&fx, &mem, &vq);
    let no_notify = VRING_USED_F_NO_NOTIFY as u16;
    assert_eq!(
        used(&mem, &vq).0 & no_notify,
        0,
        "kicks on while the loop sleeps"
    );
    q.inner.set_polling(true);
    assert_eq!(
        used(&mem, &vq).0 & no_notify,
        no_notify,
        "kicks off in polling mode"
    );
    // A request queued while kicks are off is found by io_poll, without a kick.
    mem.write_obj(spec::T_IN, GuestAddress(HDR)).unwrap();
    mem.write_obj(0u64, GuestAddress(HDR + 8)).unwrap();
    vq.add_desc_chains(&read_chain(0, DATA, STATUS), 0).unwrap();
    assert!(q.inner.has_avail());
    q.inner.set_polling(false);
    assert_eq!(
        used(&mem, &vq).0 & no_notify,
        0,
        "kicks back on after polling mode"
    );
    q.stop(&ctx);
}

#[test]
fn a_buffer_misaligned_for_o_direct_goes_through_a_bounce_buffer() {
    let fx = fixture();
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap());
    let vq = MockSplitQueue::new(&*mem, 16);
    // A read of block 3 into a buffer one byte past a page boundary, then a write of it back
    // to block 5 from there.
    mem.write_obj(spec::T_IN, GuestAddress(HDR)).unwrap();
    mem.write_obj(24u64, GuestAddress(HDR + 8)).unwrap();
    vq.add_desc_chains(&read_chain(0, DATA + 1, STATUS), 0)
        .unwrap();
    let (ctx, q, _call) = serve(&fx, &mem, &vq);
    for _ in 0..1000 {
        if used(&mem, &vq).1 == 1 {
            break;
        }
        ctx.poll(true);
    }
    assert_eq!(used(&mem, &vq).2, vec![(0, 4097)]);
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        spec::S_OK
    );
    let mut block = vec![0u8; 4096];
    mem.read_slice(&mut block, GuestAddress(DATA + 1)).unwrap();
    assert!(
        block.iter().all(|&b| b == 3 ^ 0x5a),
        "the read brought block 3"
    );
    assert_eq!(
        q.stats().bounced,
        1,
        "the engine refused the misaligned iovec"
    );
    q.stop(&ctx);
}

/// What a recording in-flight log saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    Taken(u16),
    Completing(u16),
    Completed(u16, u16),
}

#[derive(Clone, Default)]
struct RecordingLog(Arc<std::sync::Mutex<Vec<Logged>>>);

impl InflightLog for RecordingLog {
    fn taken(&mut self, head: u16) {
        self.0.lock().unwrap().push(Logged::Taken(head));
    }
    fn completing(&mut self, head: u16) {
        self.0.lock().unwrap().push(Logged::Completing(head));
    }
    fn completed(&mut self, head: u16, used_idx: u16) {
        self.0
            .lock()
            .unwrap()
            .push(Logged::Completed(head, used_idx));
    }
}

/// Serves `queue` (set up by the caller) with `log` and `resubmit`, until `want` used.
fn serve_logged(
    fx: &Fixture,
    mem: &GuestMemory,
    vq: &MockSplitQueue<GuestMemoryMmap>,
    queue: Queue,
    log: RecordingLog,
    resubmit: Vec<u16>,
    want: u16,
) -> (AioContext<PollLoop>, TestQueue) {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let engine = ctx
        .attach_engine(ThreadPool::new(PoolConfig::default()).unwrap(), |_, _| {})
        .unwrap();
    let inflight = Inflight {
        log: Box::new(log),
        resubmit,
    };
    let setup = QueueSetup::new(fx.device.clone(), queue, mem.clone(), eventfd(), None)
        .with_inflight(inflight);
    let q = VirtioBlkQueue::start_with(&ctx, engine, setup).unwrap();
    for _ in 0..1000 {
        if used(mem, vq).1 == want {
            break;
        }
        ctx.poll(true);
    }
    (ctx, q)
}

/// Reads of block 2 (chain at head 0) and block 3 (head 3) into two buffers.
fn two_reads(mem: &GuestMemory, vq: &MockSplitQueue<GuestMemoryMmap>) {
    mem.write_obj(spec::T_IN, GuestAddress(HDR)).unwrap();
    mem.write_obj(16u64, GuestAddress(HDR + 8)).unwrap();
    mem.write_obj(spec::T_IN, GuestAddress(HDR + 16)).unwrap();
    mem.write_obj(24u64, GuestAddress(HDR + 24)).unwrap();
    let descs = [
        d(HDR, 16, N, 1),
        d(DATA, 4096, W | N, 2),
        d(STATUS, 1, W, 0),
        d(HDR + 16, 16, N, 4),
        d(DATA + 4096, 4096, W | N, 5),
        d(STATUS + 1, 1, W, 0),
    ];
    vq.add_desc_chains(&descs, 0).unwrap();
}

fn block_read_into(mem: &GuestMemory, at: u64, block: u8) -> bool {
    let mut buf = vec![0u8; 4096];
    mem.read_slice(&mut buf, GuestAddress(at)).unwrap();
    buf.iter().all(|&b| b == block ^ 0x5a)
}

#[test]
fn a_logged_queue_marks_heads_before_submitting_and_clears_them_after_publishing() {
    let fx = fixture();
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap());
    let vq = MockSplitQueue::new(&*mem, 16);
    two_reads(&mem, &vq);
    let log = RecordingLog::default();
    let queue = vq.create_queue().unwrap();
    let (ctx, q) = serve_logged(&fx, &mem, &vq, queue, log.clone(), Vec::new(), 2);
    assert_eq!(used(&mem, &vq).1, 2);
    let seen = log.0.lock().unwrap().clone();
    assert_eq!(&seen[..2], [Logged::Taken(0), Logged::Taken(3)]);
    // Each completion: its head as the last batch, then cleared with the used index it made.
    let done: Vec<_> = seen[2..].chunks(2).map(|c| c.to_vec()).collect();
    assert_eq!(done.len(), 2);
    for (i, pair) in done.iter().enumerate() {
        let Logged::Completing(head) = pair[0] else {
            panic!("{seen:?}")
        };
        assert_eq!(pair[1], Logged::Completed(head, i as u16 + 1), "{seen:?}");
    }
    q.stop(&ctx);
}

#[test]
fn heads_left_in_flight_run_first_and_the_ring_goes_on_after_them() {
    let fx = fixture();
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap());
    let vq = MockSplitQueue::new(&*mem, 16);
    two_reads(&mem, &vq);
    // An earlier device took both (next avail 2) and completed neither.
    let mut queue: Queue = vq.create_queue().unwrap();
    queue.set_next_avail(2);
    let log = RecordingLog::default();
    let (ctx, q) = serve_logged(&fx, &mem, &vq, queue, log.clone(), vec![3, 0], 2);
    let (_, idx, mut entries) = used(&mem, &vq);
    assert_eq!(idx, 2, "both resubmitted requests completed");
    entries.sort_unstable();
    assert_eq!(entries, [(0, 4097), (3, 4097)]);
    assert!(block_read_into(&mem, DATA, 2) && block_read_into(&mem, DATA + 4096, 3));
    let seen = log.0.lock().unwrap().clone();
    assert_eq!(
        &seen[..2],
        [Logged::Taken(3), Logged::Taken(0)],
        "in the order given"
    );
    assert_eq!((q.stats().resubmitted, q.stats().requests), (2, 2));
    // A request the driver adds now is taken from avail index 2 on.
    mem.write_obj(spec::T_IN, GuestAddress(HDR + 32)).unwrap();
    mem.write_obj(40u64, GuestAddress(HDR + 40)).unwrap();
    let third = [
        d(HDR + 32, 16, N, 7),
        d(DATA + 8192, 4096, W | N, 8),
        d(STATUS + 2, 1, W, 0),
    ];
    vq.add_desc_chains(&third, 6).unwrap();
    q.inner.process(&ctx);
    for _ in 0..1000 {
        if used(&mem, &vq).1 == 3 {
            break;
        }
        ctx.poll(true);
    }
    assert_eq!(used(&mem, &vq).2[2], (6, 4097));
    assert!(block_read_into(&mem, DATA + 8192, 5));
    assert_eq!(q.stop(&ctx), 3);
}
