//! Writes a pattern to an RBD image and reads it back, on one loop.
//!
//! ```sh
//! rbd -c /etc/ceph/ceph.conf create --size 64M rbd/demo
//! cargo run -p aio-rbd --example write_and_read -- /etc/ceph/ceph.conf rbd/demo
//! ```

use std::cell::Cell;
use std::rc::Rc;

use aio::poll::PollLoop;
use aio::AioContext;
use aio_rbd::{Cluster, ClusterOptions, ImageSpec, LentMemory, RbdImage, RbdQueue};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(conf), Some(spec)) = (args.next(), args.next()) else {
        return Err("usage: write_and_read CEPH_CONF POOL/IMAGE".into());
    };
    let cluster = Cluster::connect(&ClusterOptions::from_conf(conf, "admin"))?;
    let image = RbdImage::open(&cluster, &spec.parse::<ImageSpec>()?, false)?;
    println!(
        "{}: {} bytes, objects of {} bytes",
        image.spec(),
        image.size()?,
        image.object_size()
    );

    let ctx = AioContext::new(PollLoop::new())?;
    let queue = RbdQueue::new(image.clone(), &ctx);
    let finished = Rc::new(Cell::new(false));

    // The write ends (data durable: FUA) on this loop; the read is submitted from its end.
    let f = finished.clone();
    let reader = Rc::new(queue);
    let q = reader.clone();
    reader.write(
        0,
        LentMemory::from_vec(vec![0x5a; 64 << 10]),
        true,
        move |result, _memory| {
            result.expect("write");
            q.read(
                0,
                LentMemory::from_vec(vec![0; 64 << 10]),
                move |result, memory| {
                    let n = result.expect("read");
                    let data = memory.into_vec().expect("our buffer");
                    assert!(data[..n].iter().all(|&b| b == 0x5a));
                    println!("read back {n} bytes of 0x5a");
                    f.set(true);
                },
            );
        },
    );
    while !finished.get() {
        ctx.poll(true);
    }
    drop(reader);
    // Every request has ended; close writes librbd's cache back.
    image.close()?;
    Ok(())
}
