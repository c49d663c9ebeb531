//! What a queue reports to its dirty log, on a real context and engine over a mock
//! virtqueue: a read's data, then its status, then its used element and index; only status
//! and used ring for the other requests; the ring's notification fields; nothing of the
//! ring without its address; a tracking replaced gets the later reports.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use aio::poll::PollLoop;
use aio::pool::{PoolConfig, ThreadPool};
use aio_loop::AioContext;
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::device::{BlockDevice, DiskOptions};
use crate::queue::{GuestMemory, QueueSetup, VirtioBlkQueue};

const W: u16 = VRING_DESC_F_WRITE as u16;
const N: u16 = VRING_DESC_F_NEXT as u16;
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x11_0000;
const STATUS: u64 = 0x1f_0000;
const SIZE: u16 = 16;

/// A log that records every report.
#[derive(Default)]
struct Recorder(Mutex<Vec<(u64, u64)>>);

impl DirtyLogger for Recorder {
    fn mark(&self, addr: u64, len: u64) {
        self.0.lock().unwrap().push((addr, len));
    }
}

impl Recorder {
    fn take(&self) -> Vec<(u64, u64)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

struct Fixture {
    _dir: tempfile::TempDir,
    device: Arc<BlockDevice>,
    mem: GuestMemory,
    vq: MockSplitQueue<'static, GuestMemoryMmap>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    File::create(&path)
        .unwrap()
        .write_all(&vec![0x5a; 1 << 20])
        .unwrap();
    let options = DiskOptions {
        serial: "dirty".into(),
        ..DiskOptions::default()
    };
    let device = Arc::new(BlockDevice::open(&path, options).unwrap());
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap());
    // The mock borrows the memory; the test's memory lives as long as the test.
    let leaked: &'static GuestMemoryMmap = Box::leak(Box::new((*mem).clone()));
    let vq = MockSplitQueue::new(leaked, SIZE);
    Fixture {
        _dir: dir,
        device,
        mem,
        vq,
    }
}

type TestQueue = VirtioBlkQueue<PollLoop, ThreadPool>;

/// Serves the fixture's queue with `dirty`, `event_idx` as asked; a clone of its kick fd.
fn serve(
    fx: &Fixture,
    dirty: Option<DirtyTracking>,
    event_idx: bool,
) -> (AioContext<PollLoop>, TestQueue, File) {
    let mut queue: Queue = fx.vq.create_queue().unwrap();
    queue.set_event_idx(event_idx);
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let engine = ctx
        .attach_engine(ThreadPool::new(PoolConfig::default()).unwrap(), |_, _| {})
        .unwrap();
    let kick = crate::driver::eventfd().unwrap();
    let ours = kick.try_clone().unwrap();
    let mut setup = QueueSetup::new(fx.device.clone(), queue, fx.mem.clone(), kick, None);
    if let Some(dirty) = dirty {
        setup = setup.with_dirty_tracking(dirty);
    }
    let q = VirtioBlkQueue::start_with(&ctx, engine, setup).unwrap();
    (ctx, q, ours)
}

/// Runs `ctx` until the used index is `idx`.
fn until_used(fx: &Fixture, ctx: &AioContext<PollLoop>, idx: u16) {
    let at = fx.vq.used_addr().unchecked_add(2);
    for _ in 0..10_000 {
        if fx.mem.read_obj::<u16>(at).unwrap() == idx {
            return;
        }
        ctx.poll(true);
    }
    panic!("the used index never reached {idx}");
}

fn used(fx: &Fixture) -> u64 {
    fx.vq.used_addr().0
}

/// The reports of the used ring's element at `slot` and of the used index.
fn used_reports(fx: &Fixture, slot: u64) -> [(u64, u64); 2] {
    [(used(fx) + 4 + 8 * slot, 8), (used(fx) + 2, 2)]
}

/// `reports` without the notification field's (`at`, 2), which must be there.
fn without_notifications(reports: Vec<(u64, u64)>, at: u64) -> Vec<(u64, u64)> {
    assert!(reports.contains(&(at, 2)), "{reports:x?}");
    reports.into_iter().filter(|&r| r != (at, 2)).collect()
}

fn tracking(log: &Arc<Recorder>, used_ring: Option<u64>) -> DirtyTracking {
    DirtyTracking::new(log.clone(), used_ring)
}

/// A read of 4 KiB and 512 bytes into two buffers, chain at descriptor `at`, its header at
/// `HDR`.
fn read_chain(at: u16) -> Vec<RawDescriptor> {
    vec![
        d(HDR, 16, N, at + 1),
        d(DATA + 0x800, 4096, W | N, at + 2),
        d(DATA + 0x8000, 512, W | N, at + 3),
        d(STATUS, 1, W, 0),
    ]
}

fn header(fx: &Fixture, at: u64, kind: u32, sector: u64) {
    fx.mem.write_obj(kind, GuestAddress(at)).unwrap();
    fx.mem.write_obj(sector, GuestAddress(at + 8)).unwrap();
}

#[test]
fn a_read_reports_its_data_then_its_status_then_its_used_element() {
    let fx = fixture();
    header(&fx, HDR, spec::T_IN, 0);
    fx.vq.add_desc_chains(&read_chain(0), 0).unwrap();
    let log = Arc::new(Recorder::default());
    let (ctx, q, _kick) = serve(&fx, Some(tracking(&log, Some(used(&fx)))), false);
    until_used(&fx, &ctx, 1);
    let reports = without_notifications(log.take(), used(&fx));
    let [element, idx] = used_reports(&fx, 0);
    assert_eq!(
        reports,
        [
            (DATA + 0x800, 4096),
            (DATA + 0x8000, 512),
            (STATUS, 1),
            element,
            idx
        ],
        "in the order of the writes"
    );
    q.stop(&ctx);
    assert_eq!(log.take(), [], "stopping writes nothing");
}

#[test]
fn writes_flushes_and_refusals_report_their_status_and_used_element_only() {
    let fx = fixture();
    let (w, f, bad) = (HDR, HDR + 32, HDR + 64);
    header(&fx, w, spec::T_OUT, 0);
    header(&fx, f, spec::T_FLUSH, 0);
    header(&fx, bad, spec::T_IN, 0);
    let chains = [
        d(w, 16, N, 1),
        d(DATA, 4096, N, 2),
        d(STATUS, 1, W, 0),
        d(f, 16, N, 4),
        d(STATUS + 1, 1, W, 0),
        // A header of 15 bytes: refused, its status written.
        d(bad, 15, N, 6),
        d(DATA, 512, W | N, 7),
        d(STATUS + 2, 1, W, 0),
    ];
    fx.vq.add_desc_chains(&chains, 0).unwrap();
    let log = Arc::new(Recorder::default());
    let (ctx, q, _kick) = serve(&fx, Some(tracking(&log, Some(used(&fx)))), false);
    until_used(&fx, &ctx, 3);
    let reports = without_notifications(log.take(), used(&fx));
    let mut statuses: Vec<_> = reports.iter().filter(|r| r.1 == 1).copied().collect();
    statuses.sort();
    assert_eq!(statuses, [(STATUS, 1), (STATUS + 1, 1), (STATUS + 2, 1)]);
    let mut rest: Vec<_> = reports.into_iter().filter(|r| r.1 != 1).collect();
    rest.sort();
    let mut expected: Vec<_> = (0..3).flat_map(|i| used_reports(&fx, i)).collect();
    expected.sort();
    assert_eq!(rest, expected, "no data: the device wrote none");
    q.stop(&ctx);
}

#[test]
fn get_id_reports_the_serial_it_wrote() {
    let fx = fixture();
    header(&fx, HDR, spec::T_GET_ID, 0);
    let chain = [d(HDR, 16, N, 1), d(DATA, 64, W | N, 2), d(STATUS, 1, W, 0)];
    fx.vq.add_desc_chains(&chain, 0).unwrap();
    let log = Arc::new(Recorder::default());
    let (ctx, q, _kick) = serve(&fx, Some(tracking(&log, None)), false);
    until_used(&fx, &ctx, 1);
    assert_eq!(
        log.take(),
        [(DATA, spec::ID_BYTES as u64), (STATUS, 1)],
        "no used ring: its address was not given"
    );
    q.stop(&ctx);
}

#[test]
fn with_event_idx_the_avail_event_is_reported() {
    let fx = fixture();
    header(&fx, HDR, spec::T_IN, 0);
    fx.vq.add_desc_chains(&read_chain(0), 0).unwrap();
    let log = Arc::new(Recorder::default());
    let (ctx, q, _kick) = serve(&fx, Some(tracking(&log, Some(used(&fx)))), true);
    until_used(&fx, &ctx, 1);
    let avail_event = used(&fx) + 4 + 8 * u64::from(SIZE);
    let reports = without_notifications(log.take(), avail_event);
    assert_eq!(reports.len(), 5, "{reports:x?}");
    q.stop(&ctx);
}

#[test]
fn a_replaced_tracking_gets_the_later_reports_and_none_stops_them() {
    let fx = fixture();
    let (first, second) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
    let (ctx, q, kick) = serve(&fx, Some(tracking(&first, None)), false);
    let flush = |i: u16| {
        let at = HDR + 32 * u64::from(i);
        header(&fx, at, spec::T_FLUSH, 0);
        let chain = [d(at, 16, N, 2 * i + 1), d(STATUS + u64::from(i), 1, W, 0)];
        fx.vq.add_desc_chains(&chain, 2 * i).unwrap();
        (&kick).write_all(&1u64.to_ne_bytes()).unwrap();
    };
    flush(0);
    until_used(&fx, &ctx, 1);
    assert_eq!(first.take(), [(STATUS, 1)]);
    q.set_dirty_tracking(Some(tracking(&second, None)));
    flush(1);
    until_used(&fx, &ctx, 2);
    assert_eq!(first.take(), [], "the old log gets nothing more");
    assert_eq!(second.take(), [(STATUS + 1, 1)]);
    q.set_dirty_tracking(None);
    flush(2);
    until_used(&fx, &ctx, 3);
    assert_eq!((first.take(), second.take()), (vec![], vec![]));
    q.stop(&ctx);
}

#[test]
fn a_request_in_flight_reports_to_the_tracking_of_its_completion() {
    let fx = fixture();
    header(&fx, HDR, spec::T_IN, 0);
    let (first, second) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
    let (ctx, q, kick) = serve(&fx, Some(tracking(&first, None)), false);
    fx.vq.add_desc_chains(&read_chain(0), 0).unwrap();
    (&kick).write_all(&1u64.to_ne_bytes()).unwrap();
    // The iteration that reads the kick submits the read; its completion is delivered by a
    // later one.
    while q.stats().requests == 0 {
        ctx.poll(true);
    }
    assert_eq!(q.in_flight(), 1, "the read is in flight");
    q.set_dirty_tracking(Some(tracking(&second, None)));
    until_used(&fx, &ctx, 1);
    assert_eq!(first.take(), []);
    assert_eq!(
        second.take(),
        [(DATA + 0x800, 4096), (DATA + 0x8000, 512), (STATUS, 1)]
    );
    q.stop(&ctx);
}
