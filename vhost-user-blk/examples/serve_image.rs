//! Serves one image as a vhost-user-blk device until Ctrl-C.
//!
//! ```sh
//! truncate -s 1G /tmp/disk.img
//! cargo run --release -p aio-vhost-user-blk --example serve_image -- /tmp/disk.img /tmp/vhost.sock
//! # then, for example:
//! qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
//!     -chardev socket,id=c0,path=/tmp/vhost.sock -device vhost-user-blk-pci,chardev=c0
//! ```

use aio_vhost_user_blk::daemon::{run, Args};
use clap::Parser;

fn main() {
    let mut argv = std::env::args().skip(1);
    let (Some(image), Some(socket)) = (argv.next(), argv.next()) else {
        eprintln!("usage: serve_image IMAGE SOCKET");
        std::process::exit(2);
    };
    let args = Args::parse_from([
        "serve_image".to_string(),
        "--disk".to_string(),
        format!("socket={socket},image={image},serial=example,queues=2"),
        "--engine".to_string(),
        "auto".to_string(),
        "--iothreads".to_string(),
        "2".to_string(),
    ]);
    if let Err(e) = run(&args) {
        eprintln!("serve_image: {e}");
        std::process::exit(1);
    }
}
