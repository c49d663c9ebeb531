//! Makes a qcow2 image in a directory where `O_DIRECT` works and prints what `qemu-img info`
//! says of it, as a test of a crate of this workspace would; then the engines this machine
//! builds and what `/proc` says of this process.
//!
//! `cargo run -p aio-test-support --example qcow2_info`

use aio_test_support::{images, tool};

fn main() {
    if !tool::installed("qemu-img") {
        eprintln!(
            "qemu-img is missing (install {})",
            tool::package_of("qemu-img")
        );
        std::process::exit(2);
    }
    let dir = images::image_dir("example");
    let image = images::qcow2_image(dir.path(), "disk.qcow2", "64M");
    print!(
        "{}",
        tool::run("qemu-img", &["info", image.to_str().expect("a UTF-8 path")])
    );
    for (kind, _) in aio_test_support::engines::engines() {
        println!("engine: {kind}");
    }
    let me = aio_test_support::procfs::Proc::current();
    println!("{} fds open, {} KiB resident", me.fd_count(), me.rss_kib());
}
