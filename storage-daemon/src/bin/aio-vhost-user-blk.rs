//! `aio-vhost-user-blk`: `aio-storage-daemon`'s name before it was a crate of its own, kept
//! for one release (the same program: `--help`).
fn main() {
    std::process::exit(aio_storage_daemon::cli::main(
        std::env::args().skip(1).collect(),
    ));
}
