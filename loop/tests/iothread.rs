//! `IoThread`: closures from many threads, order per sender, stop with work pending, panics
//! reported, build errors, and the loop's own features (bottom halves, counters) through it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aio_backend_poll::PollLoop;
use aio_core::AioError;
use aio_loop::{AioContext, IoThread, IoThreadError, PollParams};

type Log = Mutex<Vec<(usize, usize)>>;

fn spawn_logging(name: &str) -> IoThread<PollLoop, Log> {
    IoThread::spawn(name, || {
        Ok::<_, AioError>((AioContext::new(PollLoop::new())?, Mutex::new(Vec::new())))
    })
    .unwrap()
}

#[test]
fn ten_thousand_closures_from_eight_threads_run_once_in_order_per_sender() {
    let iothread = spawn_logging("iot-order");
    let senders: Vec<_> = (0..8)
        .map(|sender| {
            let handle = iothread.handle();
            std::thread::spawn(move || {
                for seq in 0..1250 {
                    handle
                        .run(move |_, log: &Log| log.lock().unwrap().push((sender, seq)))
                        .unwrap();
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let log = iothread.call(|_, log| log.lock().unwrap().clone()).unwrap();
    assert_eq!(log.len(), 10_000, "each exactly once");
    for sender in 0..8 {
        let seqs: Vec<usize> = log
            .iter()
            .filter(|(s, _)| *s == sender)
            .map(|e| e.1)
            .collect();
        assert_eq!(
            seqs,
            (0..1250).collect::<Vec<_>>(),
            "sender {sender}: in order"
        );
    }
}

#[test]
fn stop_runs_what_was_accepted_and_refuses_the_rest() {
    let iothread = spawn_logging("iot-stop");
    let handle = iothread.handle();
    // The first closure holds the thread until stop() has begun; the 1,000 are sent while it
    // runs, so they are still in the queue (not yet taken) when the thread is told to stop.
    let (open_gate, gate) = std::sync::mpsc::channel::<()>();
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    handle
        .run(move |_, _| {
            started_tx.send(()).unwrap();
            gate.recv().unwrap();
        })
        .unwrap();
    started.recv().unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..1000 {
        let r = ran.clone();
        handle
            .run(move |_, _| {
                r.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
    }
    let stopper = std::thread::spawn(move || iothread.stop());
    // Stop has begun once new closures are refused (a handshake on the queue, no sleep).
    while handle.run(|_, _| {}).is_ok() {
        std::thread::yield_now();
    }
    assert_eq!(ran.load(Ordering::Relaxed), 0, "the queue is still blocked");
    open_gate.send(()).unwrap();
    stopper.join().unwrap().unwrap();
    assert_eq!(
        ran.load(Ordering::Relaxed),
        1000,
        "nothing accepted is dropped"
    );
    assert!(matches!(
        handle.run(|_, _| {}),
        Err(IoThreadError::Stopped { .. })
    ));
    assert!(matches!(
        handle.call(|_, _| 1),
        Err(IoThreadError::Stopped { .. })
    ));
}

#[test]
fn panics_are_reported_and_the_thread_goes_on() {
    let iothread = spawn_logging("iot-panic");
    match iothread.call(|_, _| -> u32 { panic!("in a call") }) {
        Err(IoThreadError::Panicked { message, .. }) => assert!(message.contains("in a call")),
        other => panic!("{other:?}"),
    }
    iothread.run(|_, _| panic!("fire and forget")).unwrap();
    assert_eq!(iothread.call(|_, _| 5).unwrap(), 5, "still running");
    let panics = iothread.take_panics();
    assert_eq!(panics.len(), 1);
    assert!(panics[0].contains("fire and forget"));
    // Another iothread is untouched.
    let other = spawn_logging("iot-other");
    assert_eq!(other.call(|_, _| 6).unwrap(), 6);
}

#[test]
fn a_failed_build_is_an_error_and_a_call_from_the_thread_is_refused() {
    let e = IoThread::<PollLoop, ()>::spawn("iot-bad", || {
        Err::<(AioContext<PollLoop>, ()), _>("no disk")
    })
    .unwrap_err();
    assert!(e.to_string().contains("no disk"), "{e}");
    let iothread = spawn_logging("iot-self");
    let handle = iothread.handle();
    let inner = iothread
        .call(move |_, _| {
            matches!(
                handle.call(|_, _| ()),
                Err(IoThreadError::WouldDeadlock { .. })
            )
        })
        .unwrap();
    assert!(inner);
}

#[test]
fn bottom_halves_poll_params_and_counters_through_the_handle() {
    let iothread = spawn_logging("iot-bh");
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let bh = iothread
        .bh_new(move |_| {
            r.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    let scheduler = std::thread::spawn(move || {
        for _ in 0..100 {
            bh.schedule();
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    scheduler.join().unwrap();
    iothread.set_poll_params(PollParams::iothread()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ran.load(Ordering::Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let counters = iothread.counters().unwrap();
    assert!(
        counters.bh_runs >= 1 && counters.iterations >= 1,
        "{counters:?}"
    );
    let max = iothread.call(|ctx, _| ctx.poll_params().max_ns).unwrap();
    assert_eq!(max, PollParams::iothread().max_ns);
}
