//! Natural batching: requests that arrive while earlier batches are in flight ride together
//! in the next one.
//!
//! A [`Batcher`] runs at most `in_flight` batches at a time. While every slot is busy,
//! arrivals wait in a queue; when a slot frees, everything queued (up to `max_items` and
//! `max_bytes`) becomes the next batch. There is no timer: an idle batcher runs a lone request
//! at once, so batching adds no latency, and under load a batch holds whatever arrived
//! during one round trip. Each caller gets its own result.
//!
//! With `in_flight = 1` a batch never starts before the previous one finished, so a request
//! is served by a round that began *after* it arrived — what a linearizable read needs from
//! its read-index round (etcd's linearizable read loop).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

/// Bounds of one [`Batcher`].
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Batches running at once.
    pub in_flight: usize,
    /// Most requests in one batch.
    pub max_items: usize,
    /// A batch is closed once its requests' sizes add up to this (a single larger request
    /// still goes alone).
    pub max_bytes: usize,
}

struct Item<I, O> {
    input: I,
    size: usize,
    reply: oneshot::Sender<O>,
}

/// Collects requests of type `I` into batches and hands each its own `O`. Cheap to clone;
/// the batching task ends when the last clone is dropped.
pub struct Batcher<I, O> {
    tx: mpsc::UnboundedSender<Item<I, O>>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Start the batching task. `run` gets each batch's inputs in arrival order and must
    /// return one output per input, in the same order (missing outputs drop their callers'
    /// reply channels, which [`Batcher::call`] reports as `gone`).
    pub fn spawn<F, Fut>(limits: Limits, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<O>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<Item<I, O>>();
        let slots = Arc::new(Semaphore::new(limits.in_flight.max(1)));
        tokio::spawn(async move {
            loop {
                // A slot first: requests arriving meanwhile queue up for this batch.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else {
                    return;
                };
                let mut bytes = first.size;
                let mut items = vec![first];
                while items.len() < limits.max_items && bytes < limits.max_bytes {
                    match rx.try_recv() {
                        Ok(item) => {
                            bytes += item.size;
                            items.push(item);
                        }
                        Err(_) => break,
                    }
                }
                let (inputs, replies): (Vec<I>, Vec<oneshot::Sender<O>>) = items
                    .into_iter()
                    .map(|item| (item.input, item.reply))
                    .unzip();
                let batch = run(inputs);
                tokio::spawn(async move {
                    let outputs = batch.await;
                    for (reply, out) in replies.into_iter().zip(outputs) {
                        let _ = reply.send(out);
                    }
                    drop(slot);
                });
            }
        });
        Batcher { tx }
    }

    /// Queue `input` (of about `size` bytes) for the next batch, without waiting: requests
    /// queued one after another by one task keep their order within and across batches
    /// (batches start in order).
    pub fn submit(&self, input: I, size: usize) -> oneshot::Receiver<O> {
        let (reply, rx) = oneshot::channel();
        // A closed channel drops `reply`: the receiver then reports the batcher gone.
        let _ = self.tx.send(Item { input, size, reply });
        rx
    }

    /// [`Batcher::submit`] and wait for the output; `gone` if the batcher stopped or its
    /// batch produced no output for this request.
    pub async fn call(&self, input: I, size: usize, gone: impl FnOnce() -> O) -> O {
        self.submit(input, size).await.unwrap_or_else(|_| gone())
    }

    /// [`Batcher::call`] for several `(input, size)`: all are queued, in order, before any
    /// is waited for, so they keep their order and share batches. One output each.
    pub async fn call_all(
        &self,
        inputs: impl IntoIterator<Item = (I, usize)>,
        gone: impl Fn() -> O,
    ) -> Vec<O> {
        let pending: Vec<_> = inputs
            .into_iter()
            .map(|(input, size)| self.submit(input, size))
            .collect();
        let mut out = Vec::with_capacity(pending.len());
        for rx in pending {
            out.push(rx.await.unwrap_or_else(|_| gone()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    const LIMITS: Limits = Limits {
        in_flight: 1,
        max_items: 100,
        max_bytes: 1 << 20,
    };

    #[tokio::test]
    async fn arrivals_during_a_batch_share_the_next_one() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let b = Batcher::spawn(LIMITS, move |batch: Vec<u32>| {
            seen.lock().unwrap().push(batch.len());
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                batch.into_iter().map(|x| x * 2).collect::<Vec<_>>()
            }
        });
        let first = b.submit(1, 1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let rest: Vec<_> = (2..=10).map(|i| b.submit(i, 1)).collect();
        assert_eq!(first.await.unwrap(), 2);
        for (i, rx) in (2..=10).zip(rest) {
            assert_eq!(rx.await.unwrap(), i * 2, "each caller gets its own output");
        }
        assert_eq!(*sizes.lock().unwrap(), vec![1, 9]);
    }

    #[tokio::test]
    async fn a_batch_is_bounded_by_count_and_bytes() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let limits = Limits {
            in_flight: 1,
            max_items: 4,
            max_bytes: 10,
        };
        let b = Batcher::spawn(limits, move |batch: Vec<usize>| {
            seen.lock().unwrap().push(batch.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                batch
            }
        });
        let block = b.submit(0, 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let queued: Vec<_> = [1, 1, 1, 1, 1, 6, 6, 20, 1]
            .into_iter()
            .map(|s| b.submit(s, s))
            .collect();
        block.await.unwrap();
        for rx in queued {
            rx.await.unwrap();
        }
        let got = sizes.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![vec![0], vec![1, 1, 1, 1], vec![1, 6, 6], vec![20], vec![1]]
        );
    }

    #[tokio::test]
    async fn missing_outputs_report_gone() {
        let b = Batcher::spawn(LIMITS, |_: Vec<u8>| async { Vec::<u8>::new() });
        assert_eq!(b.call(1, 1, || 99).await, 99);
    }
}
