//! A blocking RESP client that shows replies exactly as the node sent them (error texts,
//! push frames), for tests that need to see what redis-rs would hide or reinterpret.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Longest a [`Raw`] connection waits to connect, and for one reply.
pub const RAW_STEP: Duration = Duration::from_secs(20);

/// A RESP reply as the raw client reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum R {
    Status(String),
    Err(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Option<Vec<R>>),
    Map(Vec<(R, R)>),
    Null,
}

impl R {
    pub fn bulk(s: &str) -> R {
        R::Bulk(Some(s.to_owned()))
    }
    pub fn err(s: &str) -> R {
        R::Err(s.to_owned())
    }
    pub fn ok() -> R {
        R::Status("OK".into())
    }
    /// A pub/sub frame, e.g. `["message", channel, payload]`.
    pub fn push(items: &[&str]) -> R {
        R::Array(Some(items.iter().map(|s| R::bulk(s)).collect()))
    }
}

/// One blocking connection; every read is bounded by [`RAW_STEP`].
pub struct Raw {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Raw {
    pub fn connect(addr: &str) -> Raw {
        let deadline = Instant::now() + RAW_STEP;
        let stream = loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => panic!("connecting to {addr}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        stream
            .set_read_timeout(Some(RAW_STEP))
            .expect("read timeout");
        Raw {
            reader: BufReader::new(stream.try_clone().expect("clone")),
            writer: stream,
        }
    }

    /// Connect and `AUTH user pass`.
    pub fn login(addr: &str, user: &str, pass: &str) -> Raw {
        let mut raw = Raw::connect(addr);
        assert_eq!(raw.send(&["AUTH", user, pass]), R::ok(), "AUTH {user}");
        raw
    }

    /// Send one command; do not wait for the reply.
    pub fn write(&mut self, args: &[&str]) {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.writer.write_all(&req).expect("write");
    }

    /// Send one command and read one reply.
    pub fn send(&mut self, args: &[&str]) -> R {
        self.write(args);
        self.read()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.reader.read_line(&mut l).expect("read");
        assert!(l.ends_with("\r\n"), "truncated reply line {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    /// Read one reply (or push frame).
    pub fn read(&mut self) -> R {
        let l = self.line();
        let (kind, rest) = l.split_at(1);
        let n = || rest.parse::<i64>().expect("a length");
        match kind {
            "+" => R::Status(rest.into()),
            "-" => R::Err(rest.into()),
            ":" => R::Int(n()),
            "_" => R::Null,
            "$" if n() < 0 => R::Bulk(None),
            "$" => {
                let mut buf = vec![0; n() as usize + 2];
                self.reader.read_exact(&mut buf).expect("bulk");
                buf.truncate(buf.len() - 2);
                R::Bulk(Some(String::from_utf8_lossy(&buf).into_owned()))
            }
            "*" | ">" if n() < 0 => R::Array(None),
            "*" | ">" => R::Array(Some((0..n()).map(|_| self.read()).collect())),
            "%" => R::Map((0..n()).map(|_| (self.read(), self.read())).collect()),
            other => panic!("unexpected reply type {other:?} in {l:?}"),
        }
    }
}
