//! The probe of the backends: which fd monitors and engines this build and kernel allow, and
//! what `auto` picks. The names and their construction are
//! [`aio_vhost_user_blk::backends`], shared with the vhost-user-blk daemon.

pub mod probe;
