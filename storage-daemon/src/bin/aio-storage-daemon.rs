//! `aio-storage-daemon`: serves disk images as vhost-user-blk devices (`--help`).
fn main() {
    std::process::exit(aio_storage_daemon::cli::main(
        std::env::args().skip(1).collect(),
    ));
}
