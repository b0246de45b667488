//! Why a keyspace command failed, typed. The text of each error is Redis's (`Display`), and it
//! is rendered into [`Reply::Error`](super::types::Reply::Error) where a command's reply is
//! made — inside `apply`, because replies are part of the replicated state (the dedup table)
//! and what a Lua script's `redis.pcall` sees.

use crate::Token;

/// Redis's reply text for a value of the wrong type.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// Reply text when a restricted user names a key outside its patterns (Redis 7.2's).
pub const NOPERM_KEY: &str = "NOPERM No permissions to access a key";
/// Reply text when a restricted user names a channel outside its patterns (Redis 7.2's).
pub const NOPERM_CHANNEL: &str = "NOPERM No permissions to access a channel";

/// A write carried a fencing token older than the key's high-water mark.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
#[error("STALE token {token} is older than {highest}")]
pub struct Stale {
    /// The token the write carried.
    pub token: Token,
    /// The key's mark: the highest token a write to it was ever accepted with.
    pub highest: Token,
}

/// Why [`Keyspace::fence_set`](super::Keyspace::fence_set) refused a write.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceError {
    #[error(transparent)]
    Stale(#[from] Stale),
    /// The value is larger than [`MAX_VALUE_LEN`](super::MAX_VALUE_LEN).
    #[error("ERR string exceeds maximum allowed size")]
    TooLarge,
}

impl From<FenceError> for KvError {
    fn from(e: FenceError) -> KvError {
        match e {
            FenceError::Stale(s) => KvError::Stale(s),
            FenceError::TooLarge => KvError::TooLarge,
        }
    }
}

/// A failed keyspace command.
#[derive(thiserror::Error, Clone, Debug, PartialEq, Eq)]
pub enum KvError {
    #[error("{WRONGTYPE}")]
    WrongType,
    #[error("ERR value is not an integer or out of range")]
    NotInteger,
    #[error("ERR value is not a valid float")]
    NotFloat,
    #[error("ERR syntax error")]
    Syntax,
    #[error("ERR increment or decrement would overflow")]
    Overflow,
    #[error("ERR string exceeds maximum allowed size")]
    TooLarge,
    /// `cmd` in lower case.
    #[error("ERR invalid expire time in '{0}' command")]
    InvalidExpire(String),
    /// `cmd` in lower case.
    #[error("ERR wrong number of arguments for '{0}' command")]
    Arity(String),
    /// The full text (it quotes the command and its first arguments).
    #[error("{0}")]
    UnknownCommand(String),
    #[error("ERR This Redis command is not allowed from script")]
    NotFromScript,
    #[error("NOSCRIPT No matching script. Please use EVAL.")]
    NoScript,
    #[error(transparent)]
    Stale(#[from] Stale),
    /// The full `NOPERM …` text.
    #[error("{0}")]
    NoPerm(String),
    /// A script's error, passed on with its own text.
    #[error("{0}")]
    Script(String),
    /// Any other invalid request: the text after `ERR `.
    #[error("ERR {0}")]
    Invalid(String),
}

impl KvError {
    /// [`KvError::Invalid`] with `msg` (the text after `ERR `).
    pub fn invalid(msg: impl Into<String>) -> KvError {
        KvError::Invalid(msg.into())
    }
}

/// The result of one command.
pub type KvResult<T> = Result<T, KvError>;
