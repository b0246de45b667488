//! RESP framing: parsing requests (RESP2/RESP3 arrays of bulk strings, and inline commands)
//! and encoding replies as RESP2 or RESP3.
//!
//! Parsing is incremental (mini-redis style): `Ok(None)` means "need more bytes", never an
//! error. Every length is checked against [`Limits`] before anything is allocated, and
//! nesting is bounded, so a malicious frame gets a clear protocol error — never a panic, a
//! huge allocation or deep recursion.

use fenced_core::kv::Reply;

/// Bounds on what one request may claim.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest bulk string.
    pub max_bulk: usize,
    /// Most elements of one array.
    pub max_elements: usize,
    /// Largest request (one frame), in bytes.
    pub max_request: usize,
    /// Deepest nesting of aggregates.
    pub max_depth: usize,
    /// The connection is not authenticated yet (and the server requires it): Redis's
    /// bounds for that (CVE-2021-32675) apply on top — at most [`UNAUTH_MAX_ARGS`]
    /// arguments of at most [`UNAUTH_MAX_BULK`] bytes, checked when the header is read,
    /// before any of the body is buffered.
    pub before_auth: bool,
}

/// Most arguments of a request before authentication (Redis: `ll > 10 && authRequired(c)`).
pub const UNAUTH_MAX_ARGS: usize = 10;
/// Largest bulk of a request before authentication (Redis: `ll > 16384 && authRequired(c)`).
pub const UNAUTH_MAX_BULK: usize = 16 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 16 * 1024 * 1024,
            max_elements: 1024 * 1024,
            max_request: 64 * 1024 * 1024,
            max_depth: 8,
            before_auth: false,
        }
    }
}

/// A parsed request frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Integer(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Frame>),
}

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    #[error("Protocol error: invalid multibulk length")]
    BadArrayLength,
    #[error("Protocol error: invalid bulk length")]
    BadBulkLength,
    /// More than [`UNAUTH_MAX_ARGS`] arguments before authentication (Redis's text).
    #[error("Protocol error: unauthenticated multibulk length")]
    UnauthArrayLength,
    /// A bulk over [`UNAUTH_MAX_BULK`] bytes before authentication (Redis's text).
    #[error("Protocol error: unauthenticated bulk length")]
    UnauthBulkLength,
    #[error("Protocol error: expected '\\r\\n' after bulk data")]
    MissingCrlf,
    #[error("Protocol error: invalid integer")]
    BadInteger,
    #[error("Protocol error: unexpected type byte '{0}'")]
    BadType(char),
    #[error("Protocol error: nesting deeper than {0}")]
    TooDeep(usize),
    #[error("Protocol error: request larger than {0} bytes")]
    TooLarge(usize),
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    #[error("Protocol error: expected an array of bulk strings")]
    NotACommand,
}

impl Frame {
    /// The command's arguments, if this frame is an array of strings (bulk or simple) or
    /// integers, as clients send them.
    pub fn into_argv(self) -> Result<Vec<Vec<u8>>, FrameError> {
        match self {
            Frame::Array(items) => items
                .into_iter()
                .map(|f| match f {
                    Frame::Bulk(b) | Frame::Simple(b) => Ok(b),
                    Frame::Integer(i) => Ok(i.to_string().into_bytes()),
                    _ => Err(FrameError::NotACommand),
                })
                .collect(),
            _ => Err(FrameError::NotACommand),
        }
    }
}

/// A parsed command and the number of bytes it took.
pub type Request = (Vec<Vec<u8>>, usize);

/// Parse one request from the front of `buf`: `Ok(Some((argv, consumed)))`, `Ok(None)` if
/// `buf` holds only part of a request, or a protocol error (the connection is then closed,
/// like Redis does). Inline commands (`PING\r\n`) are accepted too.
pub fn parse_request(buf: &[u8], limits: &Limits) -> Result<Option<Request>, FrameError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first == b'*' {
        let mut cur = Cursor {
            buf,
            pos: 0,
            limits,
        };
        return match cur.frame(0)? {
            None => {
                if buf.len() > limits.max_request {
                    return Err(FrameError::TooLarge(limits.max_request));
                }
                Ok(None)
            }
            Some(f) => {
                if cur.pos > limits.max_request {
                    return Err(FrameError::TooLarge(limits.max_request));
                }
                Ok(Some((f.into_argv()?, cur.pos)))
            }
        };
    }
    // Inline command: one line, words separated by spaces, with "..." / '...' quoting.
    let Some(end) = find_crlf_or_lf(buf) else {
        if buf.len() > limits.max_request.min(64 * 1024) {
            return Err(FrameError::TooLarge(limits.max_request.min(64 * 1024)));
        }
        return Ok(None);
    };
    let line = &buf[..end.0];
    let argv = split_inline(line)?;
    if argv.len() > limits.max_elements {
        return Err(FrameError::BadArrayLength);
    }
    Ok(Some((argv, end.1)))
}

/// Parse one frame of any type (for tests and clients of this module).
pub fn parse_frame(buf: &[u8], limits: &Limits) -> Result<Option<(Frame, usize)>, FrameError> {
    let mut cur = Cursor {
        buf,
        pos: 0,
        limits,
    };
    Ok(cur.frame(0)?.map(|f| (f, cur.pos)))
}

fn find_crlf_or_lf(buf: &[u8]) -> Option<(usize, usize)> {
    let i = buf.iter().position(|b| *b == b'\n')?;
    let end = if i > 0 && buf[i - 1] == b'\r' {
        i - 1
    } else {
        i
    };
    Some((end, i + 1))
}

fn split_inline(line: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= line.len() {
            break;
        }
        let mut word = Vec::new();
        if line[i] == b'"' || line[i] == b'\'' {
            let q = line[i];
            i += 1;
            loop {
                match line.get(i) {
                    None => return Err(FrameError::UnbalancedQuotes),
                    Some(c) if *c == q => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if q == b'"' && i + 1 < line.len() => {
                        word.push(match line[i + 1] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            c => c,
                        });
                        i += 2;
                    }
                    Some(c) => {
                        word.push(*c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < line.len() && !line[i].is_ascii_whitespace() {
                word.push(line[i]);
                i += 1;
            }
        }
        out.push(word);
    }
    Ok(out)
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    limits: &'a Limits,
}

impl Cursor<'_> {
    /// The next line (without CRLF), `Ok(None)` if incomplete; a header line (type byte
    /// `*`, `$`, `:`) longer than 32 bytes is an error at once.
    fn line(&mut self, header: bool) -> Result<Option<&[u8]>, FrameError> {
        let rest = &self.buf[self.pos..];
        let window = if header {
            &rest[..rest.len().min(34)]
        } else {
            rest
        };
        match window.windows(2).position(|w| w == b"\r\n") {
            Some(i) => {
                self.pos += i + 2;
                Ok(Some(&rest[..i]))
            }
            None if header && rest.len() >= 34 => Err(FrameError::BadInteger),
            None => Ok(None),
        }
    }

    fn int(line: &[u8]) -> Result<i64, FrameError> {
        if line.is_empty() || line.len() > 20 {
            return Err(FrameError::BadInteger);
        }
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or(FrameError::BadInteger)
    }

    fn frame(&mut self, depth: usize) -> Result<Option<Frame>, FrameError> {
        if depth > self.limits.max_depth {
            return Err(FrameError::TooDeep(self.limits.max_depth));
        }
        let Some(&t) = self.buf.get(self.pos) else {
            return Ok(None);
        };
        self.pos += 1;
        let Some(line) = self.line(matches!(t, b'*' | b'$' | b':'))? else {
            // A line that never ends is bounded by max_request in the caller.
            return Ok(None);
        };
        match t {
            b'+' => Ok(Some(Frame::Simple(line.to_vec()))),
            b'-' => Ok(Some(Frame::Error(line.to_vec()))),
            b':' => Ok(Some(Frame::Integer(Self::int(line)?))),
            b'_' => Ok(Some(Frame::Null)),
            b'$' => {
                let n = Self::int(line).map_err(|_| FrameError::BadBulkLength)?;
                if n == -1 {
                    return Ok(Some(Frame::Null));
                }
                if n < 0 || n as u64 > self.limits.max_bulk as u64 {
                    return Err(FrameError::BadBulkLength);
                }
                if self.limits.before_auth && n as u64 > UNAUTH_MAX_BULK as u64 {
                    return Err(FrameError::UnauthBulkLength);
                }
                let n = n as usize;
                if self.buf.len() - self.pos < n + 2 {
                    return Ok(None);
                }
                let data = &self.buf[self.pos..self.pos + n];
                if &self.buf[self.pos + n..self.pos + n + 2] != b"\r\n" {
                    return Err(FrameError::MissingCrlf);
                }
                self.pos += n + 2;
                Ok(Some(Frame::Bulk(data.to_vec())))
            }
            b'*' => {
                let n = Self::int(line).map_err(|_| FrameError::BadArrayLength)?;
                if n == -1 {
                    return Ok(Some(Frame::Null));
                }
                if n < 0 || n as u64 > self.limits.max_elements as u64 {
                    return Err(FrameError::BadArrayLength);
                }
                if self.limits.before_auth && n as u64 > UNAUTH_MAX_ARGS as u64 {
                    return Err(FrameError::UnauthArrayLength);
                }
                // Never trust the claimed count for the allocation.
                let mut items = Vec::with_capacity((n as usize).min(1024));
                for _ in 0..n {
                    match self.frame(depth + 1)? {
                        Some(f) => items.push(f),
                        None => return Ok(None),
                    }
                }
                Ok(Some(Frame::Array(items)))
            }
            other => Err(FrameError::BadType(other as char)),
        }
    }
}

/// RESP protocol version of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Resp2,
    Resp3,
}

/// Append the encoding of `r` to `out`.
pub fn encode(r: &Reply, proto: Proto, out: &mut Vec<u8>) {
    match r {
        Reply::Status(s) => line(out, b'+', s.as_bytes()),
        Reply::Error(e) => line(out, b'-', e.as_bytes()),
        Reply::Int(i) => {
            out.push(b':');
            out.extend_from_slice(i.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Reply::Bulk(b) => bulk(out, b),
        Reply::Nil => out.extend_from_slice(if proto == Proto::Resp3 {
            b"_\r\n"
        } else {
            b"$-1\r\n"
        }),
        Reply::NilArray => out.extend_from_slice(if proto == Proto::Resp3 {
            b"_\r\n"
        } else {
            b"*-1\r\n"
        }),
        Reply::Double(d) => match proto {
            Proto::Resp3 => line(out, b',', d.as_bytes()),
            Proto::Resp2 => bulk(out, d.as_bytes()),
        },
        Reply::Array(items) => {
            header(out, b'*', items.len());
            for it in items {
                encode(it, proto, out);
            }
        }
        Reply::Map(pairs) => {
            match proto {
                Proto::Resp3 => header(out, b'%', pairs.len()),
                Proto::Resp2 => header(out, b'*', pairs.len() * 2),
            }
            for (k, v) in pairs {
                encode(k, proto, out);
                encode(v, proto, out);
            }
        }
    }
}

/// A pub/sub message: RESP3 push (`>`), RESP2 array.
pub fn encode_push(items: &[Reply], proto: Proto, out: &mut Vec<u8>) {
    header(
        out,
        if proto == Proto::Resp3 { b'>' } else { b'*' },
        items.len(),
    );
    for it in items {
        encode(it, proto, out);
    }
}

fn header(out: &mut Vec<u8>, t: u8, n: usize) {
    out.push(t);
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    header(out, b'$', b.len());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// A simple string or error: CR/LF inside would break the framing, so they become spaces.
fn line(out: &mut Vec<u8>, t: u8, s: &[u8]) {
    out.push(t);
    out.extend(
        s.iter()
            .map(|c| if *c == b'\r' || *c == b'\n' { b' ' } else { *c }),
    );
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(b: &[u8]) -> Result<Option<Request>, FrameError> {
        parse_request(b, &Limits::default())
    }

    #[test]
    fn parses_arrays_inline_and_partials() {
        let req = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        assert_eq!(
            p(req),
            Ok(Some((vec![b"GET".to_vec(), b"k".to_vec()], req.len())))
        );
        for cut in 0..req.len() {
            assert_eq!(p(&req[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(p(b"PING\r\n"), Ok(Some((vec![b"PING".to_vec()], 6))));
        assert_eq!(
            p(b"set k \"a b\\n\"\n"),
            Ok(Some((
                vec![b"set".to_vec(), b"k".to_vec(), b"a b\n".to_vec()],
                14
            )))
        );
    }

    #[test]
    fn rejects_malformed_and_huge() {
        assert_eq!(p(b"*-5\r\n"), Err(FrameError::BadArrayLength));
        assert_eq!(p(b"*99999999999\r\n"), Err(FrameError::BadArrayLength));
        assert_eq!(
            p(b"*1\r\n$999999999999\r\n"),
            Err(FrameError::BadBulkLength)
        );
        assert_eq!(p(b"*1\r\n$1\r\nab\r\n"), Err(FrameError::MissingCrlf));
        assert_eq!(p(b"*1\r\n!x\r\n"), Err(FrameError::BadType('!')));
        assert_eq!(p(b"*1\r\n*1\r\n$1\r\na\r\n"), Err(FrameError::NotACommand));
        let deep = "*1\r\n".repeat(100);
        assert_eq!(p(deep.as_bytes()), Err(FrameError::TooDeep(8)));
    }

    #[test]
    fn before_auth_requests_are_small_and_refused_at_the_header() {
        let anon = Limits {
            before_auth: true,
            ..Limits::default()
        };
        let p = |b: &[u8]| parse_request(b, &anon);
        // The header alone is enough: nothing of the body needs to have arrived.
        assert_eq!(p(b"*11\r\n"), Err(FrameError::UnauthArrayLength));
        assert_eq!(p(b"*4\r\n$16000000\r\n"), Err(FrameError::UnauthBulkLength));
        assert_eq!(p(b"*1\r\n$16385\r\n"), Err(FrameError::UnauthBulkLength));
        assert_eq!(
            FrameError::UnauthBulkLength.to_string(),
            "Protocol error: unauthenticated bulk length"
        );
        assert_eq!(
            FrameError::UnauthArrayLength.to_string(),
            "Protocol error: unauthenticated multibulk length"
        );
        // Redis's order: the absolute bounds first.
        assert_eq!(p(b"*99999999999\r\n"), Err(FrameError::BadArrayLength));
        assert_eq!(
            p(b"*1\r\n$999999999999\r\n"),
            Err(FrameError::BadBulkLength)
        );
        // At the bounds: accepted.
        assert_eq!(p(b"*10\r\n"), Ok(None));
        let mut req = b"*1\r\n$16384\r\n".to_vec();
        req.extend(std::iter::repeat_n(b'a', 16384));
        req.extend_from_slice(b"\r\n");
        assert!(matches!(p(&req), Ok(Some((argv, n))) if argv[0].len() == 16384 && n == req.len()));
        // Authenticated: the same requests are only partial.
        assert_eq!(super::tests::p(b"*11\r\n"), Ok(None));
        assert_eq!(super::tests::p(b"*4\r\n$16000000\r\n"), Ok(None));
    }

    #[test]
    fn encodes_both_protocols() {
        let mut o = Vec::new();
        encode(
            &Reply::Map(vec![(Reply::bulk("a"), Reply::Int(1))]),
            Proto::Resp2,
            &mut o,
        );
        assert_eq!(o, b"*2\r\n$1\r\na\r\n:1\r\n");
        o.clear();
        encode(
            &Reply::Map(vec![(Reply::bulk("a"), Reply::Int(1))]),
            Proto::Resp3,
            &mut o,
        );
        assert_eq!(o, b"%1\r\n$1\r\na\r\n:1\r\n");
        o.clear();
        encode(&Reply::Nil, Proto::Resp3, &mut o);
        assert_eq!(o, b"_\r\n");
        o.clear();
        encode(&Reply::err("ERR a\r\nb"), Proto::Resp2, &mut o);
        assert_eq!(o, b"-ERR a  b\r\n");
    }
}
