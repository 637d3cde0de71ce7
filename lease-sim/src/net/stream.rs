//! A connection's bytes as its ends see them: reads that wait for what has arrived, writes that
//! the network carries, a shutdown that sends the end, and a drop that closes as a kernel does.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::{Carried, Segment, Stream, lock};

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let now = Instant::now();
            let wait_until = {
                let mut pipe = lock(&self.incoming);
                if pipe.reset_at.is_some_and(|at| at <= now) {
                    return Poll::Ready(Err(Stream::reset_error()));
                }
                let next = match pipe.segments.front_mut() {
                    Some(Segment {
                        ready: Some(ready), ..
                    }) if *ready > now => Some(*ready),
                    Some(Segment {
                        ready: Some(_),
                        what,
                    }) => {
                        match what {
                            Carried::Fin => return Poll::Ready(Ok(())),
                            Carried::Data(data) => {
                                let n = data.len().min(buf.remaining());
                                buf.put_slice(&data.split_to(n));
                                if data.is_empty() {
                                    pipe.segments.pop_front();
                                }
                            }
                        }
                        return Poll::Ready(Ok(()));
                    }
                    // Nothing, or held: wait for a writer or a release.
                    _ => None,
                };
                let next = match (next, pipe.reset_at) {
                    (Some(next), Some(reset)) => Some(next.min(reset)),
                    (next, reset) => next.or(reset),
                };
                if next.is_none() {
                    pipe.reader = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                // A writer or a release may also bring it forward.
                pipe.reader = Some(cx.waker().clone());
                next
            };
            let Some(at) = wait_until else {
                return Poll::Pending;
            };
            let arrival = match &mut self.arrival {
                Some(sleep) => {
                    sleep.as_mut().reset(at);
                    sleep
                }
                slot => slot.insert(Box::pin(tokio::time::sleep_until(at))),
            };
            if arrival.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.closed || self.is_reset() {
            return Poll::Ready(Err(Stream::reset_error()));
        }
        let mut state = self.net.state();
        if !state.conns.contains_key(&self.id) {
            return Poll::Ready(Err(Stream::reset_error()));
        }
        let (from, to) = {
            let hosts = &state.conns[&self.id].hosts;
            (hosts[self.side].clone(), hosts[1 - self.side].clone())
        };
        let link = state.link(&from, &to);
        if link.lose > 0 {
            link.lose -= 1;
            state.reset(self.id);
            // Written, as far as the writer knows: it is lost on the way.
            return Poll::Ready(Ok(buf.len()));
        }
        state.send(
            self.id,
            self.side,
            Carried::Data(Bytes::copy_from_slice(buf)),
        );
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.closed {
            self.closed = true;
            let (id, side) = (self.id, self.side);
            self.net.state().send(id, side, Carried::Fin);
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut state = self.net.state();
        if !state.conns.contains_key(&self.id) {
            return;
        }
        let unread = lock(&self.incoming)
            .segments
            .iter()
            .any(|s| matches!(s.what, Carried::Data(_)));
        if unread {
            // As a kernel does when a socket is closed with data unread.
            state.reset(self.id);
            return;
        }
        if !self.closed {
            state.send(self.id, self.side, Carried::Fin);
        }
        // Forgotten once both sides have gone: the peer's drop finds it closed.
        let peer_closed = {
            let conn = &state.conns[&self.id];
            let outgoing_to_me = lock(&conn.pipes[1 - self.side]);
            outgoing_to_me
                .segments
                .back()
                .is_some_and(|s| matches!(s.what, Carried::Fin))
        };
        if peer_closed {
            state.conns.remove(&self.id);
        }
    }
}
