//! `aio-vhost-user-blk`: serves disk images as vhost-user-blk devices.
fn main() {
    std::process::exit(aio_vhost_user_blk::daemon::main_from_args(
        std::env::args().skip(1).collect(),
    ));
}
