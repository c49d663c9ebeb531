//! `aio-vhost-user-blk`: serves disk images as vhost-user-blk devices (`--help`).
fn main() {
    std::process::exit(aio_vhost_user_blk::cli::main(
        std::env::args().skip(1).collect(),
    ));
}
