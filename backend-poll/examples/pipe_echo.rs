//! An echo over pipes on the ppoll monitor: a writer thread sends lines through one pipe, the
//! loop echoes them upper-cased into another, and the main thread checks what came back.
//!
//! ```text
//! cargo run -p aio-backend-poll --example pipe_echo
//! ```

use std::cell::RefCell;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;

use aio_backend_poll::PollLoop;
use aio_loop::{AioContext, FdHandler};

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a writable array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds are fresh and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn main() {
    let ctx = AioContext::new(PollLoop::new()).expect("context");
    let (to_loop_r, to_loop_w) = pipe();
    let (from_loop_r, from_loop_w) = pipe();
    let input = Rc::new(RefCell::new(File::from(to_loop_r)));
    let output = Rc::new(RefCell::new(File::from(from_loop_w)));
    let done = Rc::new(RefCell::new(false));

    let (i, o, d) = (input.clone(), output.clone(), done.clone());
    ctx.set_fd_handler(
        &*input.borrow(),
        FdHandler::new().on_read(move |ctx| {
            let mut buf = [0u8; 4096];
            let n = i.borrow_mut().read(&mut buf).expect("read");
            if n == 0 {
                // Writer hung up: stop watching and let main() finish.
                ctx.remove_fd_handler(&*i.borrow()).expect("remove");
                *d.borrow_mut() = true;
                return;
            }
            let upper = buf[..n].to_ascii_uppercase();
            o.borrow_mut().write_all(&upper).expect("write");
        }),
    )
    .expect("set_fd_handler");

    let writer = std::thread::spawn(move || {
        let mut w = File::from(to_loop_w);
        for line in ["hello\n", "from a\n", "writer thread\n"] {
            w.write_all(line.as_bytes()).unwrap();
        }
    });
    while !*done.borrow() {
        ctx.poll(true);
    }
    writer.join().unwrap();
    drop(output);
    let mut echoed = String::new();
    File::from(from_loop_r).read_to_string(&mut echoed).unwrap();
    print!("{echoed}");
    assert_eq!(echoed, "HELLO\nFROM A\nWRITER THREAD\n");
    println!("{:?}", ctx.counters());
}
