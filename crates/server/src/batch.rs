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
//!
//! The queue is bounded (`max_queued`): past it a request is refused at once
//! ([`Refused::Full`]) instead of waiting behind an ever longer queue with ever more memory.
//!
//! A batch's sizes never add up to more than `cap_bytes` (what one entry, or one message of
//! the transport, can carry): a request larger than that is refused at once
//! ([`Refused::TooLarge`]) and never reaches a batch, so it cannot take others down with it.
//!
//! The requests of one [`Batcher::call_all`] (a client's pipeline) form a group that is
//! never split between batches: with `in_flight > 1` two batches run at once and may be
//! applied in either order, which must not reorder one client's commands.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Hard cap on a batch's sizes: a group that would take a batch past it starts the next
    /// batch, a group larger than it runs as consecutive batches (in order: each part is
    /// queued once the one before it is answered), and a single request larger than it is
    /// refused ([`Refused::TooLarge`]).
    pub cap_bytes: usize,
    /// Most requests waiting for a batch (not counting those in running batches); more are
    /// refused with [`Refused::Full`].
    pub max_queued: usize,
}

/// Why a request got no output from its batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The batcher stopped, or the batch produced no output for it.
    Gone,
    /// `max_queued` requests were already waiting.
    Full { queued: usize },
    /// The request alone is larger than a batch may be (`cap_bytes`); it was not queued.
    TooLarge { size: usize, cap: usize },
}

struct Item<I, O> {
    input: I,
    size: usize,
    reply: oneshot::Sender<O>,
}

/// Requests queued together by one caller ([`Batcher::call_all`]): never split between
/// batches, so they reach `run` together and in their order. Two batches may run at once
/// (`in_flight > 1`), and then nothing orders one against the other.
type Group<I, O> = Vec<Item<I, O>>;

fn group_bytes<I, O>(g: &Group<I, O>) -> usize {
    g.iter().map(|i| i.size).sum()
}

/// Collects requests of type `I` into batches and hands each its own `O`. Cheap to clone;
/// the batching task ends when the last clone is dropped.
pub struct Batcher<I, O> {
    tx: mpsc::UnboundedSender<Group<I, O>>,
    /// Requests queued, not yet taken into a batch.
    queued: Arc<AtomicUsize>,
    max_queued: usize,
    cap_bytes: usize,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
            queued: self.queued.clone(),
            max_queued: self.max_queued,
            cap_bytes: self.cap_bytes,
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Start the batching task. `run` gets each batch's inputs in arrival order and must
    /// return one output per input, in the same order (missing outputs drop their callers'
    /// reply channels, which [`Batcher::call`] reports as gone).
    pub fn spawn<F, Fut>(limits: Limits, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<O>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<Group<I, O>>();
        let slots = Arc::new(Semaphore::new(limits.in_flight.max(1)));
        let queued = Arc::new(AtomicUsize::new(0));
        let taken = queued.clone();
        tokio::spawn(async move {
            // A group that did not fit into the last batch opens the next one.
            let mut carried: Option<Group<I, O>> = None;
            loop {
                // A slot first: requests arriving meanwhile queue up for this batch.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let first = match carried.take() {
                    Some(g) => g,
                    None => match rx.recv().await {
                        Some(g) => g,
                        None => return,
                    },
                };
                let mut bytes = group_bytes(&first);
                let mut items = first;
                while items.len() < limits.max_items && bytes < limits.max_bytes {
                    let Ok(group) = rx.try_recv() else { break };
                    let more = group_bytes(&group);
                    // Whole groups only; like a single request, a group may take a batch past
                    // `max_bytes` (it is checked before adding), never past `max_items` or
                    // `cap_bytes` (a group is at most `cap_bytes`: `call_all`).
                    if items.len() + group.len() > limits.max_items
                        || bytes.saturating_add(more) > limits.cap_bytes
                    {
                        carried = Some(group);
                        break;
                    }
                    bytes += more;
                    items.extend(group);
                }
                taken.fetch_sub(items.len(), Ordering::Relaxed);
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
        Batcher {
            tx,
            queued,
            max_queued: limits.max_queued,
            cap_bytes: limits.cap_bytes,
        }
    }

    /// Queue `inputs` (each with its size) as one group for the next batch, without
    /// waiting: refused whole when the queue has no room for all of them. Groups queued one
    /// after another by one task start in their order.
    fn submit_group(
        &self,
        inputs: impl IntoIterator<Item = (I, usize)>,
    ) -> Result<Vec<oneshot::Receiver<O>>, Refused> {
        let (group, receivers): (Group<I, O>, Vec<_>) = inputs
            .into_iter()
            .map(|(input, size)| {
                let (reply, rx) = oneshot::channel();
                (Item { input, size, reply }, rx)
            })
            .unzip();
        let n = group.len();
        let queued = self.queued.fetch_add(n, Ordering::Relaxed);
        if queued + n > self.max_queued {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            return Err(Refused::Full { queued });
        }
        if self.tx.send(group).is_err() {
            // The batching task is gone: the receivers report it.
            self.queued.fetch_sub(n, Ordering::Relaxed);
        }
        Ok(receivers)
    }

    /// Queue `input` (of about `size` bytes) for the next batch, without waiting: requests
    /// queued one after another by one task keep their order within and across batches
    /// (batches start in order). Refused at once when `max_queued` requests wait already, or
    /// when `size` is over `cap_bytes`.
    pub fn submit(&self, input: I, size: usize) -> Result<oneshot::Receiver<O>, Refused> {
        self.fits(size)?;
        let mut rx = self.submit_group([(input, size)])?;
        rx.pop().ok_or(Refused::Gone)
    }

    /// [`Batcher::submit`] and wait for the output; `refused(why)` if the queue was full, the
    /// batcher stopped, or its batch produced no output for this request.
    pub async fn call(&self, input: I, size: usize, refused: impl FnOnce(Refused) -> O) -> O {
        match self.submit(input, size) {
            Ok(rx) => rx.await.unwrap_or_else(|_| refused(Refused::Gone)),
            Err(why) => refused(why),
        }
    }

    /// `Ok` if a request of `size` bytes may be queued at all.
    fn fits(&self, size: usize) -> Result<(), Refused> {
        if size > self.cap_bytes {
            return Err(Refused::TooLarge {
                size,
                cap: self.cap_bytes,
            });
        }
        Ok(())
    }

    /// [`Batcher::call`] for several `(input, size)` as one group: they ride in the same
    /// batch, in their order (a group larger than a batch goes alone), or are all refused
    /// when the queue has no room for them. One output each.
    ///
    /// A request over `cap_bytes` is refused alone ([`Refused::TooLarge`]), the others go on.
    /// A group whose sizes add up to more than `cap_bytes` is cut into consecutive parts
    /// that fit, each queued once the one before it is answered, so they stay in order even
    /// with several batches in flight.
    pub async fn call_all(
        &self,
        inputs: impl IntoIterator<Item = (I, usize)>,
        refused: impl Fn(Refused) -> O,
    ) -> Vec<O> {
        let mut out: Vec<Option<O>> = Vec::new();
        let mut parts: Vec<Vec<(usize, (I, usize))>> = Vec::new();
        let mut part_bytes = 0usize;
        for (i, (input, size)) in inputs.into_iter().enumerate() {
            out.push(None);
            if let Err(why) = self.fits(size) {
                out[i] = Some(refused(why));
                continue;
            }
            match parts.last_mut() {
                Some(part) if part_bytes.saturating_add(size) <= self.cap_bytes => {
                    part_bytes += size;
                    part.push((i, (input, size)));
                }
                _ => {
                    part_bytes = size;
                    parts.push(vec![(i, (input, size))]);
                }
            }
        }
        for part in parts {
            let (at, inputs): (Vec<usize>, Vec<(I, usize)>) = part.into_iter().unzip();
            match self.submit_group(inputs) {
                Ok(pending) => {
                    for (i, rx) in at.into_iter().zip(pending) {
                        out[i] = Some(rx.await.unwrap_or_else(|_| refused(Refused::Gone)));
                    }
                }
                Err(why) => {
                    for i in at {
                        out[i] = Some(refused(why));
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| refused(Refused::Gone)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    // The single-threaded tests run in paused time: their sleeps order the steps (a batch
    // running while more requests queue) whatever the machine's load; in real time a stall of
    // 15 ms between two steps changed the batches they check.

    const LIMITS: Limits = Limits {
        in_flight: 1,
        max_items: 100,
        max_bytes: 1 << 20,
        cap_bytes: 1 << 30,
        max_queued: 1_000,
    };

    #[tokio::test(start_paused = true)]
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
        let first = b.submit(1, 1).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let rest: Vec<_> = (2..=10).map(|i| b.submit(i, 1).unwrap()).collect();
        assert_eq!(first.await.unwrap(), 2);
        for (i, rx) in (2..=10).zip(rest) {
            assert_eq!(rx.await.unwrap(), i * 2, "each caller gets its own output");
        }
        assert_eq!(*sizes.lock().unwrap(), vec![1, 9]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_bounded_by_count_and_bytes() {
        let limits = Limits {
            in_flight: 1,
            max_items: 4,
            max_bytes: 10,
            cap_bytes: 1_000,
            max_queued: 1_000,
        };
        let (b, sizes) = recording(limits, Duration::from_millis(20));
        let block = b.submit(0, 1).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let queued: Vec<_> = [1, 1, 1, 1, 1, 6, 6, 20, 1]
            .into_iter()
            .map(|s| b.submit(s, s).unwrap())
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

    /// Limits with a soft close at 10 and a hard cap at 12 bytes.
    const CAPPED: Limits = Limits {
        in_flight: 1,
        max_items: 100,
        max_bytes: 10,
        cap_bytes: 12,
        max_queued: 1_000,
    };

    /// Every batch a test batcher ran.
    type Seen = Arc<Mutex<Vec<Vec<usize>>>>;

    /// A batcher that records each batch's sizes and answers each request with its size
    /// after `pause`.
    fn recording(limits: Limits, pause: Duration) -> (Batcher<usize, usize>, Seen) {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = batches.clone();
        let b = Batcher::spawn(limits, move |batch: Vec<usize>| {
            seen.lock().unwrap().push(batch.clone());
            async move {
                tokio::time::sleep(pause).await;
                batch
            }
        });
        (b, batches)
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_that_would_cross_the_cap_starts_the_next_batch() {
        let (b, batches) = recording(CAPPED, Duration::from_millis(20));
        let block = b.submit(0, 1).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let queued: Vec<_> = [1, 6, 6, 5, 12, 1]
            .into_iter()
            .map(|s| b.submit(s, s).unwrap())
            .collect();
        block.await.unwrap();
        for rx in queued {
            rx.await.unwrap();
        }
        let got = batches.lock().unwrap().clone();
        // Before, [1, 6, 6] rode together (13 bytes: under 10 when the last 6 was added).
        assert_eq!(
            got,
            vec![vec![0], vec![1, 6], vec![6, 5], vec![12], vec![1]]
        );
        assert!(got.iter().all(|batch| batch.iter().sum::<usize>() <= 12));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_over_the_cap_is_refused_alone_and_the_others_go_on() {
        let (b, batches) = recording(CAPPED, Duration::from_millis(1));
        let refused = |why| match why {
            Refused::TooLarge { size, cap: 12 } => 1_000 + size,
            _ => 0,
        };
        let out = b.call_all([(1, 1), (13, 13), (2, 2)], refused).await;
        assert_eq!(out, vec![1, 1_013, 2]);
        assert_eq!(b.call(20, 20, refused).await, 1_020);
        assert!(matches!(
            b.submit(13, 13),
            Err(Refused::TooLarge { size: 13, cap: 12 })
        ));
        let got = batches.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![vec![1, 2]],
            "the large ones never reached a batch"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_over_the_cap_runs_as_consecutive_batches_in_order() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = log.clone();
        let limits = Limits {
            in_flight: 2,
            ..CAPPED
        };
        let b = Batcher::spawn(limits, move |batch: Vec<usize>| {
            let seen = seen.clone();
            seen.lock().unwrap().push(format!("start {batch:?}"));
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                seen.lock().unwrap().push(format!("end {batch:?}"));
                batch
            }
        });
        let group: Vec<(usize, usize)> = [5, 5, 4, 6, 3].into_iter().map(|s| (s, s)).collect();
        let out = b.call_all(group, |_| 0).await;
        assert_eq!(out, vec![5, 5, 4, 6, 3]);
        // Parts of at most 12 bytes, each started after the one before it ended (two
        // batches may run at once, which would not order them).
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                "start [5, 5]",
                "end [5, 5]",
                "start [4, 6]",
                "end [4, 6]",
                "start [3]",
                "end [3]"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn missing_outputs_report_gone() {
        let b = Batcher::spawn(LIMITS, |_: Vec<u8>| async { Vec::<u8>::new() });
        assert_eq!(b.call(1, 1, |_| 99).await, 99);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_is_never_split_between_batches() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = batches.clone();
        let limits = Limits {
            in_flight: 2,
            max_items: 8,
            ..LIMITS
        };
        let b = Batcher::spawn(limits, move |batch: Vec<u32>| {
            seen.lock().unwrap().push(batch.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                batch
            }
        });
        for round in 0..50u32 {
            // Singles from another task race the group into the batcher.
            let singles = {
                let b = b.clone();
                tokio::spawn(async move {
                    for i in 0..5 {
                        b.call(100_000 + i, 1, |_| 0).await;
                    }
                })
            };
            let group: Vec<(u32, usize)> = (0..6).map(|i| (round * 100 + i, 1)).collect();
            let out = b.call_all(group.clone(), |_| 0).await;
            assert_eq!(out, group.iter().map(|g| g.0).collect::<Vec<_>>());
            singles.await.unwrap();
            let all = batches.lock().unwrap().clone();
            let holding: Vec<_> = all
                .iter()
                .filter(|batch| batch.iter().any(|x| x / 100 == round))
                .collect();
            assert_eq!(
                holding.len(),
                1,
                "round {round}: the group was split: {holding:?}"
            );
            let at = holding[0].iter().position(|x| *x == round * 100).unwrap();
            assert_eq!(
                holding[0][at..at + 6],
                (0..6).map(|i| round * 100 + i).collect::<Vec<_>>()[..],
                "in order and together"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once_and_frees_up_as_batches_start() {
        let limits = Limits {
            max_queued: 3,
            ..LIMITS
        };
        let b = Batcher::spawn(limits, |batch: Vec<u32>| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            batch
        });
        let running = b.submit(0, 1).expect("an idle batcher takes it");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let queued: Vec<_> = (1..=3).map(|i| b.submit(i, 1).expect("room")).collect();
        assert_eq!(b.submit(4, 1).err(), Some(Refused::Full { queued: 3 }));
        assert_eq!(
            b.call(5, 1, |why| if why == Refused::Gone { 0 } else { 55 })
                .await,
            55
        );
        assert_eq!(running.await.unwrap(), 0);
        for (i, rx) in (1..=3).zip(queued) {
            assert_eq!(rx.await.unwrap(), i);
        }
        // The queue drained into a batch: room again.
        assert_eq!(b.call(6, 1, |_| 0).await, 6);
    }
}
