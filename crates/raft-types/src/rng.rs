//! The one source of randomness of a node (docs/architecture.md, "Seams for the simulator").
//!
//! Every random draw a node makes — openraft's election timeouts (through [`FencedRuntime`],
//! the configuration's `AsyncRuntime`), a data dir's incarnation, the one-off client ids the
//! front ends give calls without a request id — comes from a per-thread generator here. In
//! production it is seeded from OS entropy the first time a thread draws. A simulator that runs
//! its nodes on one thread seeds that thread with [`seed_thread`] first, so that one seed gives
//! one run.
//!
//! Secrets (the gRPC auth tokens, `fenced-server`'s `users.rs`) are not drawn here: they stay on
//! the OS generator, whatever a simulator seeds.

use std::cell::RefCell;
use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

thread_local! {
    static RNG: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Seed this thread's generator: every later draw on this thread follows from `seed`.
pub fn seed_thread(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

/// Run `f` on this thread's generator (seeded from OS entropy on first use unless
/// [`seed_thread`] seeded it). `f` must not draw through this module itself.
pub fn with<T>(f: impl FnOnce(&mut StdRng) -> T) -> T {
    RNG.with(|r| {
        let mut r = r.borrow_mut();
        f(r.get_or_insert_with(StdRng::from_entropy))
    })
}

/// A random `u64`.
pub fn next_u64() -> u64 {
    with(|r| r.next_u64())
}

/// A random `u64` other than 0 (and `u64::MAX`): ids where 0 means "none".
pub fn nonzero_u64() -> u64 {
    with(|r| r.gen_range(1..u64::MAX))
}

/// A handle on this thread's generator, for APIs that want an `Rng` value (openraft's
/// [`openraft::AsyncRuntime::thread_rng`]). Each call borrows the generator of the thread it
/// runs on.
#[derive(Clone, Copy, Default)]
pub struct ThreadRng;

impl fmt::Debug for ThreadRng {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("fenced_raft_types::rng::ThreadRng")
    }
}

impl RngCore for ThreadRng {
    fn next_u32(&mut self) -> u32 {
        with(|r| r.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        with(|r| r.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        with(|r| r.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        with(|r| r.try_fill_bytes(dest))
    }
}

/// openraft's runtime for fenced: tokio ([`openraft::TokioRuntime`]) for everything but the
/// random numbers (election timeouts), which come from this module's generator.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
pub struct FencedRuntime;

type Tokio = openraft::TokioRuntime;

impl openraft::AsyncRuntime for FencedRuntime {
    type JoinError = <Tokio as openraft::AsyncRuntime>::JoinError;
    type JoinHandle<T: openraft::OptionalSend + 'static> =
        <Tokio as openraft::AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as openraft::AsyncRuntime>::Sleep;
    type Instant = <Tokio as openraft::AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as openraft::AsyncRuntime>::TimeoutError;
    type Timeout<R, T: std::future::Future<Output = R> + openraft::OptionalSend> =
        <Tokio as openraft::AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = ThreadRng;
    type OneshotSender<T: openraft::OptionalSend> =
        <Tokio as openraft::AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <Tokio as openraft::AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: openraft::OptionalSend> =
        <Tokio as openraft::AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: std::future::Future + openraft::OptionalSend + 'static,
        T::Output: openraft::OptionalSend + 'static,
    {
        Tokio::spawn(future)
    }

    fn sleep(duration: std::time::Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    fn timeout<R, F: std::future::Future<Output = R> + openraft::OptionalSend>(
        duration: std::time::Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: std::future::Future<Output = R> + openraft::OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ThreadRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: openraft::OptionalSend,
    {
        Tokio::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::AsyncRuntime;

    fn draws(seed: Option<u64>) -> Vec<u64> {
        std::thread::spawn(move || {
            if let Some(seed) = seed {
                seed_thread(seed);
            }
            let mut out = vec![next_u64(), nonzero_u64()];
            // openraft's draw (an election timeout) goes through the same generator.
            out.push(FencedRuntime::thread_rng().gen_range(150..300));
            let mut bytes = [0u8; 8];
            ThreadRng.fill_bytes(&mut bytes);
            out.push(u64::from_le_bytes(bytes));
            out
        })
        .join()
        .expect("thread")
    }

    #[test]
    fn threads_seeded_alike_draw_alike() {
        assert_eq!(draws(Some(7)), draws(Some(7)));
        assert_ne!(draws(Some(7)), draws(Some(8)));
    }

    #[test]
    fn unseeded_threads_draw_from_entropy() {
        // Two entropy-seeded threads agreeing on four u64s would be a broken seed.
        assert_ne!(draws(None), draws(None));
        let timeout = draws(None)[2];
        assert!((150..300).contains(&timeout));
    }

    #[test]
    fn reseeding_restarts_the_sequence() {
        seed_thread(42);
        let a = (next_u64(), next_u64());
        seed_thread(42);
        assert_eq!(a, (next_u64(), next_u64()));
        assert_ne!(nonzero_u64(), 0);
    }
}
