//! A connection's TLS session, after `NBD_OPT_STARTTLS`: plaintext in and out through rustls
//! over the non-blocking socket.
//!
//! This module owns moving bytes between the socket and rustls (records in, plaintext out;
//! plaintext in, records out) and what must wait for the socket; the protocol above it does
//! not change.
//!
//! * Plaintext written is held by rustls (at most [`PLAINTEXT_HELD`]) until the socket takes
//!   its records: a connection whose session [`wants_write`](TlsSession::wants_write) watches
//!   the socket for writing.
//! * A failed handshake (a client certificate the CA did not sign, a protocol error) is a
//!   read error: the connection ends.

use std::io::{self, IoSlice, Read, Write};
use std::sync::Arc;

use rustls::{ServerConfig, ServerConnection};

use crate::stream::Stream;

/// The most plaintext rustls holds before the socket has taken its records.
const PLAINTEXT_HELD: usize = 1 << 20;

/// The socket as rustls reads and writes it.
struct Socket<'a>(&'a Stream);

impl Read for Socket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Socket<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.send(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.send(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One TLS session as the server.
pub(super) struct TlsSession {
    conn: ServerConnection,
}

impl TlsSession {
    /// A session with `config`, fed the bytes the client sent after `NBD_OPT_STARTTLS` that
    /// were already read (the start of its handshake).
    pub(super) fn start(config: &Arc<ServerConfig>, early: &[u8]) -> io::Result<Self> {
        let mut conn = ServerConnection::new(config.clone()).map_err(io::Error::other)?;
        conn.set_buffer_limit(Some(PLAINTEXT_HELD));
        let mut early = early;
        while !early.is_empty() {
            conn.read_tls(&mut early)?;
            conn.process_new_packets().map_err(io::Error::other)?;
        }
        Ok(TlsSession { conn })
    }

    /// Reads plaintext: `Ok(0)` when the client closed (its `close_notify`, or the socket's
    /// end), `WouldBlock` when nothing is there yet.
    pub(super) fn read(&mut self, stream: &Stream, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if self.conn.read_tls(&mut Socket(stream))? == 0 {
                return Ok(0);
            }
            let state = self.conn.process_new_packets();
            // Handshake messages (and a fatal alert) go out before anything else happens.
            let _ = self.flush(stream);
            state.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }

    /// Takes plaintext from `bufs` (as much as rustls holds) and sends what records the
    /// socket takes; how many plaintext bytes were taken (`WouldBlock` for none).
    pub(super) fn send(&mut self, stream: &Stream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let taken = self.conn.writer().write_vectored(bufs)?;
        self.flush(stream)?;
        if taken == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(taken)
    }

    /// Sends the records rustls holds, as far as the socket takes them.
    pub(super) fn flush(&mut self, stream: &Stream) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut Socket(stream)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether records wait for the socket.
    pub(super) fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }
}
