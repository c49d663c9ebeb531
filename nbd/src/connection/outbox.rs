//! What a connection has to send: reply headers (small replies coalesced into one buffer) and
//! read data, written in order with vectored sends as the socket takes them.
//!
//! This module owns the queue of outgoing bytes and its size; it never builds a reply.

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use aio_core::engine::AlignedBuf;

/// Headers coalesced into one item up to this size.
const COALESCE: usize = 64 << 10;
/// At most this many slices per send.
const SLICES: usize = 64;

/// One item: bytes, then (for a read) the data buffer's first `len` bytes.
#[derive(Debug)]
struct Item {
    head: Vec<u8>,
    data: Option<(AlignedBuf, usize)>,
    /// Bytes of `head` then `data` already sent.
    sent: usize,
}

impl Item {
    fn len(&self) -> usize {
        self.head.len() + self.data.as_ref().map_or(0, |d| d.1)
    }
}

/// The outgoing queue.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    items: VecDeque<Item>,
    /// Bytes queued and not yet sent.
    bytes: usize,
    /// The last send stopped because the socket was full.
    blocked: bool,
    /// Data buffers sent in full, for the connection to keep.
    spent: Vec<AlignedBuf>,
}

impl Outbox {
    /// Queues the bytes `f` appends (a reply's header, or a whole small reply).
    pub(crate) fn put(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        let head = self.head();
        let before = head.len();
        f(head);
        let n = head.len() - before;
        self.bytes += n;
    }

    /// The buffer the next reply's bytes go in: the last item's head, if it has no data
    /// after it (and room), else a new item's.
    fn head(&mut self) -> &mut Vec<u8> {
        let reuse = self
            .items
            .back()
            .is_some_and(|i| i.data.is_none() && i.head.len() < COALESCE);
        if !reuse {
            self.items.push_back(Item {
                head: Vec::with_capacity(256),
                data: None,
                sent: 0,
            });
        }
        let item = self.items.back_mut().expect("an item was just ensured");
        &mut item.head
    }

    /// Queues `buf`'s first `len` bytes after the bytes already queued.
    pub(crate) fn data(&mut self, buf: AlignedBuf, len: usize) {
        let len = len.min(buf.len());
        self.bytes += len;
        match self.items.back_mut() {
            Some(i) if i.data.is_none() => i.data = Some((buf, len)),
            _ => self.items.push_back(Item {
                head: Vec::new(),
                data: Some((buf, len)),
                sent: 0,
            }),
        }
    }

    /// Bytes not yet sent.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing is left to send.
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Whether the socket was full at the last send (it refused bytes, or took fewer than
    /// offered): the next send waits for the socket's writable readiness.
    pub(crate) fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// The data buffers sent in full since the last call.
    pub(crate) fn take_spent(&mut self) -> std::vec::Drain<'_, AlignedBuf> {
        self.spent.drain(..)
    }

    /// Drops everything queued (the client is gone).
    pub(crate) fn clear(&mut self) {
        self.items.clear();
        self.bytes = 0;
        self.blocked = false;
    }

    /// Sends as much as `sink` (the socket, or a TLS session over it) takes. An error is the
    /// socket's (the client is gone).
    pub(crate) fn send(
        &mut self,
        sink: &mut dyn FnMut(&[IoSlice<'_>]) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.blocked = false;
        while self.bytes > 0 {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(8);
            for item in self.items.iter().take(SLICES / 2) {
                let mut skip = item.sent;
                let head = &item.head[skip.min(item.head.len())..];
                skip = skip.saturating_sub(item.head.len());
                if !head.is_empty() {
                    slices.push(IoSlice::new(head));
                }
                if let Some((buf, len)) = &item.data {
                    if skip < *len {
                        slices.push(IoSlice::new(&buf[skip..*len]));
                    }
                }
            }
            let offered: usize = slices.iter().map(|s| s.len()).sum();
            let sent = match sink(&slices) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.blocked = true;
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            drop(slices);
            self.bytes -= sent;
            let mut left = sent;
            while left > 0 {
                let Some(item) = self.items.front_mut() else {
                    break;
                };
                let rest = item.len() - item.sent;
                if left >= rest {
                    left -= rest;
                    if let Some(Item {
                        data: Some((buf, _)),
                        ..
                    }) = self.items.pop_front()
                    {
                        self.spent.push(buf);
                    }
                } else {
                    item.sent += left;
                    left = 0;
                }
            }
            // A short send: the socket is full. Asking again would only hear `WouldBlock`
            // (one wasted syscall per reply batch); the writable readiness says when to go on.
            if sent < offered {
                self.blocked = true;
                return Ok(());
            }
        }
        // Nothing left: the last head buffer is kept for the next replies.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_send_blocks_the_outbox_without_asking_the_socket_again() {
        let mut outbox = Outbox::default();
        outbox.put(|o| o.extend_from_slice(&[1; 16]));
        let mut data = AlignedBuf::new(4096);
        data.fill(2);
        outbox.data(data, 4096);
        let mut calls = 0;
        let mut got = Vec::new();
        // The socket takes 100 bytes, then would have to be asked again.
        outbox
            .send(&mut |slices| {
                calls += 1;
                let mut n = 0;
                for s in slices {
                    let take = (100 - n).min(s.len());
                    got.extend_from_slice(&s[..take]);
                    n += take;
                }
                Ok(n)
            })
            .unwrap();
        assert_eq!(calls, 1, "a short send is not followed by another");
        assert!(outbox.is_blocked());
        assert_eq!(outbox.bytes(), 16 + 4096 - 100);
        // Writable again: the rest goes, in order, and the data buffer comes back.
        outbox
            .send(&mut |slices| {
                let n = slices.iter().map(|s| s.len()).sum();
                for s in slices {
                    got.extend_from_slice(s);
                }
                Ok(n)
            })
            .unwrap();
        assert!(!outbox.is_blocked() && outbox.is_empty());
        assert_eq!(&got[..16], &[1; 16]);
        assert!(got[16..].iter().all(|&b| b == 2) && got.len() == 16 + 4096);
        assert_eq!(outbox.take_spent().count(), 1);
    }

    #[test]
    fn a_full_socket_blocks_the_outbox_and_keeps_every_byte() {
        let mut outbox = Outbox::default();
        outbox.put(|o| o.extend_from_slice(b"reply"));
        outbox
            .send(&mut |_| Err(io::ErrorKind::WouldBlock.into()))
            .unwrap();
        assert!(outbox.is_blocked());
        assert_eq!(outbox.bytes(), 5);
    }
}
