//! A client's socket: a Unix or TCP stream, read and written without blocking.
//!
//! This module owns the socket calls (and the one `unsafe` call, `sendmsg` with
//! `MSG_NOSIGNAL`, so that a client gone mid-reply is an `EPIPE` error and never a
//! `SIGPIPE` that would kill a program which did not ignore it); it never parses bytes.

use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;

/// A connected client socket.
#[derive(Debug)]
pub enum Stream {
    /// A Unix-domain stream.
    Unix(UnixStream),
    /// A TCP stream (`TCP_NODELAY` set: replies go out as they are written).
    Tcp(TcpStream),
}

impl Stream {
    /// Makes the socket non-blocking (and a TCP one `TCP_NODELAY`).
    pub fn prepare(&self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(true),
            Stream::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)
            }
        }
    }

    /// Reads what is there (0: the client closed its end).
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => (&*s).read(buf),
            Stream::Tcp(s) => (&*s).read(buf),
        }
    }

    /// Sends from `bufs` in order; how many bytes went.
    pub fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: a zeroed msghdr is valid (no name, no control data); `msg_iov` points to
        // `bufs`, whose `IoSlice`s are ABI-compatible with `iovec` and borrowed for the
        // call; the kernel only reads them.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
            libc::sendmsg(self.as_fd().as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Another handle on the same socket (to shut it down from another thread).
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// Shuts both directions down: the connection's reads see the end, its writes fail.
    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}
