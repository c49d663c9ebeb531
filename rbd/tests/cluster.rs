//! aio-rbd against a one-node Ceph cluster (`scripts/ceph-cluster.sh`, or the one
//! `AIO_CEPH_CONF` names): one test that starts the cluster once and runs every case on it.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use aio::poll::PollLoop;
use aio::AioContext;
use aio_rbd::testing::TestCluster;
use aio_rbd::{
    Cluster, ClusterOptions, ImageSpec, LentMemory, LockRecords, LockTaken, RbdError, RbdImage,
    RbdQueue,
};

const MIB: u64 = 1 << 20;

/// Runs `ctx`'s loop until `done` says so.
fn run_until(ctx: &AioContext<PollLoop>, done: impl Fn() -> bool) {
    while !done() {
        ctx.poll(true);
    }
}

#[test]
fn rbd_images_on_a_one_node_cluster() {
    if let Ok(args) = std::env::var(CHILD_ENV) {
        hold_the_lock_until_killed(&args);
    }
    let Some(test) = TestCluster::get() else {
        return;
    };
    let cluster = test.connect();
    let v = aio_rbd::librbd_version().unwrap();
    assert!(v.0 >= 1, "{v:?}");
    requests_end_on_the_submitting_loop_with_the_data(&cluster);
    several_loops_share_one_image_each_hearing_its_own(&cluster);
    block_status_reports_written_objects_only(&cluster);
    errors_are_typed(&test, &cluster);
    the_exclusive_lock_keeps_one_writer_and_a_dead_holder_is_broken(&test, &cluster);
    a_close_waits_for_the_requests_in_flight(&cluster);
    requests_as_futures(&cluster);
    a_namespace_and_a_snapshot(&test, &cluster);
}

/// An image in a namespace, and its snapshot (made with Ceph's `rbd` tool), opened by spec:
/// the snapshot is read-only and keeps the bytes it was taken with.
fn a_namespace_and_a_snapshot(test: &TestCluster, cluster: &Arc<Cluster>) {
    let ns = TestCluster::unique_name("ns");
    test.rbd(&["namespace", "create", &format!("rbd/{ns}")]);
    let spec: ImageSpec = format!("rbd/{ns}/disk").parse().unwrap();
    RbdImage::create(cluster, &spec, 16 * MIB).unwrap();
    let image = RbdImage::open(cluster, &spec, false).unwrap();
    let (r, _) = block_on(image.submit(
        aio_rbd::RbdOp::Write(0),
        Some(LentMemory::from_vec(vec![1; 4096])),
    ));
    r.unwrap();
    image.close().unwrap();
    test.rbd(&["snap", "create", &format!("{spec}@s1")]);
    let image = RbdImage::open(cluster, &spec, false).unwrap();
    let (r, _) = block_on(image.submit(
        aio_rbd::RbdOp::Write(0),
        Some(LentMemory::from_vec(vec![2; 4096])),
    ));
    r.unwrap();
    image.close().unwrap();
    // The namespace is the image's: the same name in the default namespace does not exist.
    let e = RbdImage::open(cluster, &"rbd/disk".parse().unwrap(), false).unwrap_err();
    assert!(matches!(e, RbdError::NoSuchImage { .. }), "{e}");
    let snap = RbdImage::open(cluster, &spec.clone().snapshot("s1"), false).unwrap();
    assert!(snap.is_read_only(), "a snapshot opens read-only");
    let mut head = vec![0u8; 4096];
    snap.read_at(0, &mut head).unwrap();
    assert!(head.iter().all(|&b| b == 1), "the snapshot keeps its bytes");
    let (r, _) = block_on(snap.submit(
        aio_rbd::RbdOp::Write(0),
        Some(LentMemory::from_vec(vec![3; 4096])),
    ));
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    let e = RbdImage::open(cluster, &spec.clone().snapshot("nope"), false).unwrap_err();
    assert!(matches!(e, RbdError::NoSuchImage { .. }), "{e}");
}

/// Polls `f` on this thread until it is ready, parked between wake-ups.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

fn requests_as_futures(cluster: &Arc<Cluster>) {
    use aio_rbd::RbdOp;
    let spec = TestCluster::new_image(cluster, "t", 16 * MIB);
    let image = RbdImage::open(cluster, &spec, false).unwrap();
    let (r, m) = block_on(image.submit(
        RbdOp::Write(4096),
        Some(LentMemory::from_vec(vec![9; 8192])),
    ));
    assert_eq!(r.unwrap(), 0);
    assert_eq!(
        m.unwrap().into_vec().unwrap().len(),
        8192,
        "the memory comes back"
    );
    let (r, m) =
        block_on(image.submit(RbdOp::Read(4096), Some(LentMemory::from_vec(vec![0; 8192]))));
    assert_eq!(r.unwrap(), 8192);
    assert!(m.unwrap().into_vec().unwrap().iter().all(|&b| b == 9));
    let (r, _) = block_on(image.submit(RbdOp::Flush, None));
    r.unwrap();
    // A future dropped at once: its read still runs, its memory with librbd until the end,
    // which the close waits for.
    drop(image.submit(
        RbdOp::Read(0),
        Some(LentMemory::from_vec(vec![0; MIB as usize])),
    ));
    image.close().unwrap();
    assert_eq!(image.in_flight(), 0);
    let (r, _) = block_on(image.submit(RbdOp::Flush, None));
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EBADF), "closed");
    RbdImage::remove(cluster, &spec).unwrap();
}

fn requests_end_on_the_submitting_loop_with_the_data(cluster: &Arc<Cluster>) {
    let spec = TestCluster::new_image(cluster, "t", 64 * MIB);
    let image = RbdImage::open(cluster, &spec, false).unwrap();
    assert_eq!(image.size().unwrap(), 64 * MIB);
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let queue = RbdQueue::new(image.clone(), &ctx);
    let ends = Rc::new(RefCell::new(Vec::<(&str, io::Result<usize>)>::new()));
    let loop_thread = std::thread::current().id();

    // A vectored write of two segments with FUA, then a read of the same bytes.
    let mut data = vec![0u8; 128 << 10];
    data.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i % 251) as u8);
    let e = ends.clone();
    queue.write(
        MIB,
        LentMemory::from_vec(data.clone()),
        true,
        move |r, _| {
            assert_eq!(std::thread::current().id(), loop_thread);
            e.borrow_mut().push(("write", r.map(|()| 0)));
        },
    );
    assert!(
        ends.borrow().is_empty(),
        "a request never ends inside its submission"
    );
    run_until(&ctx, || ends.borrow().len() == 1);
    let back = Rc::new(RefCell::new(None));
    let b = back.clone();
    queue.read(
        MIB,
        LentMemory::from_vec(vec![0; 128 << 10]),
        move |r, m| {
            assert_eq!(r.unwrap(), 128 << 10);
            *b.borrow_mut() = Some(m.into_vec().expect("our vector"));
        },
    );
    run_until(&ctx, || back.borrow().is_some());
    assert!(
        back.borrow().as_deref() == Some(&data[..]),
        "read back what was written"
    );

    // Write-zeroes (thick and unmapping), discard, flush: all end, and read as zeros.
    for (name, unmap) in [("zero-thick", false), ("zero-unmap", true)] {
        let e = ends.clone();
        queue.write_zeroes(MIB, 64 << 10, unmap, move |r| {
            e.borrow_mut().push((name, r.map(|()| 0)))
        });
    }
    let e = ends.clone();
    queue.discard(MIB + (64 << 10), 64 << 10, move |r| {
        e.borrow_mut().push(("discard", r.map(|()| 0)))
    });
    let e = ends.clone();
    queue.flush(move |r| e.borrow_mut().push(("flush", r.map(|()| 0))));
    run_until(&ctx, || ends.borrow().len() == 5);
    for (name, r) in ends.borrow().iter() {
        assert!(r.is_ok(), "{name}: {r:?}");
    }
    let mut zeros = vec![0xffu8; 128 << 10];
    image.read_at(MIB, &mut zeros).unwrap();
    assert!(
        zeros.iter().all(|&b| b == 0),
        "zeroed and discarded ranges read as zeros"
    );
    assert_eq!(queue.waiting(), 0);
    assert_eq!(image.in_flight(), 0);

    // Resize is seen by the next size query; a read past the new end fails with an errno.
    image.resize(32 * MIB).unwrap();
    assert_eq!(image.size().unwrap(), 32 * MIB);
    let failed = Rc::new(RefCell::new(None));
    let f = failed.clone();
    queue.read(
        48 * MIB,
        LentMemory::from_vec(vec![0; 4096]),
        move |r, _| *f.borrow_mut() = Some(r),
    );
    run_until(&ctx, || failed.borrow().is_some());
    assert!(
        failed.borrow_mut().take().unwrap().is_err(),
        "a read past the end fails"
    );
    drop(queue);
    image.close().unwrap();
    RbdImage::remove(cluster, &spec).unwrap();
}

fn several_loops_share_one_image_each_hearing_its_own(cluster: &Arc<Cluster>) {
    let spec = TestCluster::new_image(cluster, "t", 16 * MIB);
    let image = RbdImage::open(cluster, &spec, false).unwrap();
    let threads: Vec<_> = (0..3u8)
        .map(|t| {
            let image = image.clone();
            std::thread::spawn(move || {
                let ctx = AioContext::new(PollLoop::new()).unwrap();
                let queue = RbdQueue::new(image, &ctx);
                let me = std::thread::current().id();
                let ended = Rc::new(RefCell::new(0));
                for i in 0..32u64 {
                    let e = ended.clone();
                    let at = (u64::from(t) * 32 + i) * 4096;
                    queue.write(
                        at,
                        LentMemory::from_vec(vec![t + 1; 4096]),
                        false,
                        move |r, _| {
                            r.unwrap();
                            assert_eq!(std::thread::current().id(), me, "ended on its own loop");
                            *e.borrow_mut() += 1;
                        },
                    );
                }
                run_until(&ctx, || *ended.borrow() == 32);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut all = vec![0u8; 96 * 4096];
    image.read_at(0, &mut all).unwrap();
    for (i, chunk) in all.chunks(32 * 4096).enumerate() {
        assert!(
            chunk.iter().all(|&b| b == i as u8 + 1),
            "thread {i}'s writes"
        );
    }
    image.close().unwrap();
    RbdImage::remove(cluster, &spec).unwrap();
}

fn block_status_reports_written_objects_only(cluster: &Arc<Cluster>) {
    let spec = TestCluster::new_image(cluster, "t", 64 * MIB);
    let image = RbdImage::open(cluster, &spec, false).unwrap();
    let object = image.object_size();
    assert_eq!(image.allocated(0, 64 * MIB).unwrap(), vec![]);
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let queue = RbdQueue::new(image.clone(), &ctx);
    let done = Rc::new(RefCell::new(0));
    for at in [object + 4096, 5 * object] {
        let d = done.clone();
        queue.write(
            at,
            LentMemory::from_vec(vec![1; 4096]),
            false,
            move |r, _| {
                r.unwrap();
                *d.borrow_mut() += 1;
            },
        );
    }
    run_until(&ctx, || *done.borrow() == 2);
    // Whole objects, cut to the range asked, which starts inside an object (the case librbd
    // before 17 answered wrong).
    let got = image.allocated(object + 512, 8 * object).unwrap();
    assert_eq!(
        got,
        vec![(object + 512, object - 512), (5 * object, object)]
    );
    let answer = Rc::new(RefCell::new(None));
    let a = answer.clone();
    queue.allocated(0, 64 * MIB, move |r| *a.borrow_mut() = Some(r));
    run_until(&ctx, || answer.borrow().is_some());
    let offloaded = answer.borrow_mut().take().unwrap().unwrap();
    assert_eq!(offloaded, vec![(object, object), (5 * object, object)]);
    drop(queue);
    image.close().unwrap();
    RbdImage::remove(cluster, &spec).unwrap();
}

fn errors_are_typed(test: &TestCluster, cluster: &Arc<Cluster>) {
    let e = RbdImage::open(cluster, &ImageSpec::new("rbd", "no-such-image"), false).unwrap_err();
    assert!(matches!(e, RbdError::NoSuchImage { .. }), "{e}");
    let e = RbdImage::open(cluster, &ImageSpec::new("no-such-pool", "x"), false).unwrap_err();
    assert!(matches!(e, RbdError::NoSuchPool { .. }), "{e}");
    assert_eq!(io::Error::from(e).kind(), io::ErrorKind::NotFound);
    // A wrong key: the monitors refuse it.
    let wrong = test
        .options()
        .option("key", "AQBsgvVlAAAAABAAOUdm0rS1GZR6+JZhqyr6FA==")
        .option("keyring", "/nonexistent")
        .mount_timeout(Duration::from_secs(5));
    let e = Cluster::connect(&wrong).unwrap_err();
    assert!(matches!(e, RbdError::Auth { .. }), "{e}");
    // Nobody listening: unreachable within the mount timeout, naming the monitors.
    let nobody = ClusterOptions::default()
        .option("mon_host", "127.0.0.1:1")
        .option("key", "AQBsgvVlAAAAABAAOUdm0rS1GZR6+JZhqyr6FA==")
        .mount_timeout(Duration::from_secs(2));
    let started = std::time::Instant::now();
    let e = Cluster::connect(&nobody).unwrap_err();
    assert!(matches!(e, RbdError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "bounded by the mount timeout"
    );
    // A bad config file path.
    let e = Cluster::connect(&ClusterOptions::from_conf("/nonexistent.conf", "admin")).unwrap_err();
    assert!(matches!(e, RbdError::Config { .. }), "{e}");
}

fn the_exclusive_lock_keeps_one_writer_and_a_dead_holder_is_broken(
    test: &TestCluster,
    cluster: &Arc<Cluster>,
) {
    let spec = TestCluster::new_image(cluster, "t", 16 * MIB);
    let records_dir = tempfile::tempdir().unwrap();
    let records = LockRecords::new(records_dir.path()).unwrap();
    let first = RbdImage::open(cluster, &spec, false).unwrap();
    assert_eq!(
        first.lock_exclusive(Some(&records)).unwrap(),
        LockTaken::Acquired
    );
    assert!(first.is_lock_owner().unwrap());
    let holder = first.lock_owners().unwrap();
    assert_eq!(holder.len(), 1, "{holder:?}");

    // A second client (another connection) is refused, naming the holder, and cannot write.
    let other = test.connect();
    let second = RbdImage::open(&other, &spec, false).unwrap();
    let e = second.lock_exclusive(Some(&records)).unwrap_err();
    assert!(
        matches!(&e, RbdError::Locked { holder: h, .. } if h == &holder[0]),
        "{e}"
    );
    // The holder is alive (this process), so its record does not let the lock be broken.
    assert!(first.is_lock_owner().unwrap());
    // Its writes are refused while the lock is held, not queued behind it.
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let queue = RbdQueue::new(second.clone(), &ctx);
    let refused = Rc::new(RefCell::new(None));
    let r = refused.clone();
    queue.write(
        0,
        LentMemory::from_vec(vec![1; 4096]),
        false,
        move |res, _| *r.borrow_mut() = Some(res),
    );
    run_until(&ctx, || refused.borrow().is_some());
    let e = refused.borrow_mut().take().unwrap().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert!(first.is_lock_owner().unwrap());
    drop(queue);
    drop(second);

    // Released, the lock is free for the next client.
    first.release_lock().unwrap();
    assert_eq!(first.lock_owners().unwrap(), Vec::<String>::new());
    let third = RbdImage::open(&other, &spec, false).unwrap();
    assert_eq!(third.lock_exclusive(None).unwrap(), LockTaken::Acquired);
    third.close().unwrap();
    first.close().unwrap();

    // A process that holds the lock is SIGKILLed. Without its records the lock is not
    // broken (an unknown holder may be alive); with them it is, and taken, at once.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "rbd_images_on_a_one_node_cluster", "--nocapture"])
        .env(CHILD_ENV, format!("{} {}", spec, records.dir().display()))
        .env(aio_rbd::testing::CONF_ENV, test.conf())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = io::BufReader::new(child.stdout.take().unwrap());
    while !line.contains("locked") {
        line.clear();
        assert!(
            io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "the child died"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let after = RbdImage::open(cluster, &spec, false).unwrap();
    let dead = after.lock_owners().unwrap();
    assert_eq!(dead.len(), 1, "the dead child still holds the lock");
    let e = after.lock_exclusive(None).unwrap_err();
    assert!(matches!(e, RbdError::Locked { .. }), "{e}");
    let taken = after.lock_exclusive(Some(&records)).unwrap();
    assert_eq!(
        taken,
        LockTaken::BrokeStale {
            holder: dead[0].clone()
        }
    );
    assert!(after.is_lock_owner().unwrap());
    after.close().unwrap();
    assert_eq!(
        std::fs::read_dir(records.dir()).unwrap().count(),
        0,
        "record removed on close"
    );
    // Not removed: the dead child's watch lingers on it (EBUSY) until the OSD times it out.
}

/// Set in the child process that takes a lock and waits to be killed: `SPEC RECORDS-DIR`.
const CHILD_ENV: &str = "AIO_RBD_TEST_LOCK_CHILD";

/// The child: takes the lock with records, says so, and waits for its SIGKILL.
fn hold_the_lock_until_killed(args: &str) -> ! {
    let (spec, dir) = args.split_once(' ').unwrap();
    let test = TestCluster::get().unwrap();
    let image = RbdImage::open(&test.connect(), &spec.parse().unwrap(), false).unwrap();
    let records = LockRecords::new(dir).unwrap();
    assert_eq!(
        image.lock_exclusive(Some(&records)).unwrap(),
        LockTaken::Acquired
    );
    println!("locked");
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn a_close_waits_for_the_requests_in_flight(cluster: &Arc<Cluster>) {
    let spec = TestCluster::new_image(cluster, "t", 64 * MIB);
    let image = RbdImage::open(cluster, &spec, false).unwrap();
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let queue = RbdQueue::new(image.clone(), &ctx);
    for i in 0..64 {
        queue.write(
            i * MIB,
            LentMemory::from_vec(vec![7; MIB as usize]),
            false,
            |_, _| {},
        );
    }
    assert!(image.in_flight() > 0);
    // The queue goes with its requests in flight: their memory stays with librbd's callbacks.
    drop(queue);
    image.close().unwrap();
    assert_eq!(image.in_flight(), 0);
    // Closed: a new queue's requests end with EBADF, on the loop.
    let queue = RbdQueue::new(image.clone(), &ctx);
    let r = Rc::new(RefCell::new(None));
    let rr = r.clone();
    queue.flush(move |res| *rr.borrow_mut() = Some(res));
    run_until(&ctx, || r.borrow().is_some());
    let e = r.borrow_mut().take().unwrap().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    drop(queue);
    let reopened = RbdImage::open(cluster, &spec, true).unwrap();
    let mut last = vec![0u8; 4096];
    reopened.read_at(63 * MIB, &mut last).unwrap();
    assert!(
        last.iter().all(|&b| b == 7),
        "every write in flight at close landed"
    );
    drop(reopened);
    RbdImage::remove(cluster, &spec).unwrap();
}
