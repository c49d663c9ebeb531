//! Serves one image as a vhost-user-blk device until Ctrl-C (or for `SECONDS` if given).
//!
//! ```sh
//! truncate -s 1G /tmp/disk.img
//! cargo run --release -p aio-storage-daemon --example serve_vhost_user -- /tmp/disk.img /tmp/vhost.sock
//! # then, for example:
//! qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
//!     -chardev socket,id=c0,path=/tmp/vhost.sock -device vhost-user-blk-pci,chardev=c0
//! ```

use std::time::Duration;

use aio_storage_daemon::daemon::{run, Config, DiskSpec, StopHandle};

fn main() {
    let mut argv = std::env::args().skip(1);
    let (Some(image), Some(socket)) = (argv.next(), argv.next()) else {
        eprintln!("usage: serve_vhost_user IMAGE SOCKET [SECONDS]");
        std::process::exit(2);
    };
    let disk: DiskSpec =
        match format!("socket={socket},image={image},serial=example,queues=2").parse() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("serve_vhost_user: {e}");
                std::process::exit(2);
            }
        };
    let mut config = Config::new(vec![disk]);
    config.iothreads = 2;

    // The library installs no signal handler: the program says when to stop, here after a
    // while if asked (a real program would stop on its own signal or management command).
    let stop = StopHandle::new();
    if let Some(secs) = argv.next().and_then(|s| s.parse().ok()) {
        let stopper = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(secs));
            stopper.stop();
        });
    }
    if let Err(e) = run(&config, &stop) {
        eprintln!("serve_vhost_user: {e}");
        std::process::exit(1);
    }
}
