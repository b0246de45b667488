//! The client port's node-wide budget of buffered request bytes (issue 49, like Redis's
//! `client-query-buffer-limit` plus a total; the RESP port's is `--resp-query-buffer-total`).
//!
//! tonic buffers a call's request message whole before its handler runs, up to the method's
//! limit (1 MiB for fenced's API, 2 MiB for etcd's); the gateway reads a JSON body whole
//! too. Each call is bounded so, but not all of them together: any caller with a valid
//! token (or every caller, on a node without users) could open thousands of streams, each
//! announcing a big message and never finishing it. This body wrapper, put on every
//! authenticated call by [`crate::pre_auth`], counts the bytes of messages still
//! incomplete — gRPC's length-prefixed frames are followed, so a long-lived stream (a
//! watch, a keep-alive) counts only the message it is receiving — in one total for the
//! node. A data frame that takes the total past `--grpc-request-buffer-total` fails its
//! call with `RESOURCE_EXHAUSTED` (counted in `fenced_grpc_request_buffer_refused_total`, a
//! warning at most every 10 s), unless the call's own incomplete message is under [`SMALL`] bytes:
//! ordinary small calls are never the ones refused, so the total stays under the cap plus
//! [`SMALL`] per stream in flight.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body as HttpBody, Frame, SizeHint};
use prost::bytes::Bytes;
use tonic::body::Body;
use tonic::Status;

use crate::metrics::Metrics;

/// Default `--grpc-request-buffer-total`: 256 MiB, as the RESP port's.
pub const DEFAULT_REQUEST_BUFFER_TOTAL: usize = 256 * 1024 * 1024;
/// A call whose incomplete message is under this is never refused by the total.
pub const SMALL: usize = 16 * 1024;

/// The node's total; shared by every call's [`Budgeted`] body.
pub struct RequestBudget {
    held: AtomicUsize,
    cap: usize,
    metrics: Arc<Metrics>,
    last_warning: AtomicU64,
    epoch: std::time::Instant,
}

impl RequestBudget {
    /// `cap`: `--grpc-request-buffer-total` (0: none, then [`RequestBudget::wrap`] is not
    /// asked to).
    pub fn new(cap: usize, metrics: Arc<Metrics>) -> Arc<RequestBudget> {
        Arc::new(RequestBudget {
            held: AtomicUsize::new(0),
            cap,
            metrics,
            last_warning: AtomicU64::new(u64::MAX),
            epoch: std::time::Instant::now(),
        })
    }

    /// Bytes of incomplete request messages held now, all calls together.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// `body` counted against the budget; `grpc`: it is gRPC-framed (else, the gateway's
    /// JSON, one message that ends with the body).
    pub fn wrap(self: &Arc<Self>, body: Body, grpc: bool) -> Body {
        Body::new(Budgeted {
            inner: body,
            budget: self.clone(),
            grpc,
            header: Vec::new(),
            left: 0,
            pending: 0,
        })
    }

    fn warn(&self) {
        let now = self.epoch.elapsed().as_secs();
        let last = self.last_warning.load(Ordering::Relaxed);
        if (last == u64::MAX || now >= last + 10)
            && self
                .last_warning
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                cap = self.cap,
                "gRPC call refused: the node's incomplete requests are over \
                 --grpc-request-buffer-total"
            );
        }
    }
}

/// A call's request body, counting its incomplete message's bytes in the node's total.
struct Budgeted {
    inner: Body,
    budget: Arc<RequestBudget>,
    grpc: bool,
    /// The part of the current message's 5-byte gRPC header received so far.
    header: Vec<u8>,
    /// Bytes of the current message's payload still to come.
    left: usize,
    /// Bytes of the current incomplete message counted in the total.
    pending: usize,
}

impl Budgeted {
    /// Follow `data` through the gRPC framing: the bytes that belong to a message still
    /// incomplete after it stay counted, those of messages it completes are released.
    fn advance(&mut self, mut data: &[u8]) {
        if !self.grpc {
            self.pending += data.len();
            return;
        }
        while !data.is_empty() {
            if self.left == 0 && self.header.len() < 5 {
                let take = (5 - self.header.len()).min(data.len());
                self.header.extend_from_slice(&data[..take]);
                self.pending += take;
                data = &data[take..];
                if self.header.len() == 5 {
                    let len = u32::from_be_bytes([
                        self.header[1],
                        self.header[2],
                        self.header[3],
                        self.header[4],
                    ]) as usize;
                    self.left = len;
                    if len == 0 {
                        self.complete();
                    }
                }
                continue;
            }
            let take = self.left.min(data.len());
            self.pending += take;
            self.left -= take;
            data = &data[take..];
            if self.left == 0 {
                self.complete();
            }
        }
    }

    /// The current message is whole: tonic decodes it now, its bytes leave the total.
    fn complete(&mut self) {
        self.budget.held.fetch_sub(self.pending, Ordering::Relaxed);
        self.pending = 0;
        self.header.clear();
    }
}

impl Drop for Budgeted {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.pending, Ordering::Relaxed);
    }
}

impl HttpBody for Budgeted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, Bytes::len);
                // Counted in the total now, and as `pending` by `advance` (which releases
                // what completes a message).
                let held = this.budget.held.fetch_add(len, Ordering::Relaxed) + len;
                let mine = this.pending + len;
                if held > this.budget.cap && mine >= SMALL {
                    this.budget.held.fetch_sub(len, Ordering::Relaxed);
                    this.budget.metrics.grpc_request_buffer_refused();
                    this.budget.warn();
                    return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                        "this node holds more than {} bytes of incomplete requests \
                         (--grpc-request-buffer-total); retry later, or send smaller \
                         requests",
                        this.budget.cap
                    )))));
                }
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    this.advance(&data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => {
                if !this.grpc {
                    let pending = std::mem::take(&mut this.pending);
                    this.budget.held.fetch_sub(pending, Ordering::Relaxed);
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.resize(5 + len, b'x');
        m
    }

    /// A stream of messages split at every odd place: each whole message leaves the total,
    /// only the incomplete one stays counted, and dropping the body releases it.
    #[test]
    fn only_incomplete_messages_stay_counted() {
        let budget = RequestBudget::new(1 << 20, Arc::new(Metrics::new()));
        let mut b = Budgeted {
            inner: Body::empty(),
            budget: budget.clone(),
            grpc: true,
            header: Vec::new(),
            left: 0,
            pending: 0,
        };
        let mut stream = Vec::new();
        for len in [0, 3, 100, 7000, 1] {
            stream.extend(message(len));
        }
        stream.extend(&message(5000)[..1234]);
        for chunk in stream.chunks(333) {
            // What poll_frame does with a data frame.
            budget.held.fetch_add(chunk.len(), Ordering::Relaxed);
            b.advance(chunk);
        }
        assert_eq!(budget.held(), 1234, "the incomplete message's bytes");
        assert_eq!(b.pending, 1234);
        drop(b);
        assert_eq!(budget.held(), 0);
    }
}
