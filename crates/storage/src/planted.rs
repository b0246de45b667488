//! Bugs planted on purpose, to show that the simulator finds them (docs/simulation.md,
//! "Planted bugs"). Only a build with the `planted` feature has the switch; without it
//! [`is`] is `false` and compiles away. The switch is per thread: the simulator runs a whole
//! cluster on one thread, so a seed run with a bug planted leaves every other thread's runs
//! (and production's flusher and recorder threads) alone.

/// A planted bug of this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planted {
    /// The recorder ignores its epoch check: a pass read before a truncate records the old,
    /// longer log's end over the truncate's lowered one.
    RecorderEpoch,
}

#[cfg(feature = "planted")]
thread_local! {
    static ON: std::cell::Cell<Option<Planted>> = const { std::cell::Cell::new(None) };
}

/// Whether `bug` is planted on this thread.
#[inline]
pub fn is(bug: Planted) -> bool {
    #[cfg(feature = "planted")]
    {
        ON.with(|c| c.get() == Some(bug))
    }
    #[cfg(not(feature = "planted"))]
    {
        let _ = bug;
        false
    }
}

/// Plant `bug` on this thread (`None`: none).
#[cfg(feature = "planted")]
pub fn plant(bug: Option<Planted>) {
    ON.with(|c| c.set(bug));
}
