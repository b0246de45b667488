//! Redis glob patterns (`KEYS`, `SCAN MATCH`, `PSUBSCRIBE`): `*`, `?`, `[abc]`, `[^a-z]`, `\x`.
//! Iterative with one backtrack point per `*`, so O(pattern × text) and no recursion.

/// Does `text` match the glob `pattern`?
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    while p < pattern.len() && pattern[p] == b'*' {
                        p += 1;
                    }
                    if p == pattern.len() {
                        return true;
                    }
                    star = Some((p, t));
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class(pattern, p, text[t]) {
                        if matched {
                            p = next;
                            t += 1;
                            continue;
                        }
                    } else if text[t] == b'[' {
                        // An unterminated class matches a literal '['.
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == text[t] {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if c == text[t] {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

/// Match `c` against the class starting at `pattern[start] == '['`. Returns whether it
/// matched and the index after the closing `]`, or `None` if the class is unterminated.
fn class(pattern: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    loop {
        let &pc = pattern.get(i)?;
        match pc {
            b']' => break,
            b'\\' => {
                let &e = pattern.get(i + 1)?;
                matched |= e == c;
                i += 2;
            }
            _ => {
                if pattern.get(i + 1) == Some(&b'-')
                    && pattern.get(i + 2).is_some_and(|e| *e != b']')
                {
                    let (a, b) = (pc.min(pattern[i + 2]), pc.max(pattern[i + 2]));
                    matched |= (a..=b).contains(&c);
                    i += 3;
                } else {
                    matched |= pc == c;
                    i += 1;
                }
            }
        }
    }
    Some((matched != negate, i + 1))
}

#[cfg(test)]
mod tests {
    use super::glob_match as m;

    #[test]
    fn globs() {
        assert!(m(b"*", b""));
        assert!(m(b"h?llo", b"hello"));
        assert!(m(b"h*llo", b"heeeello"));
        assert!(m(b"h[ae]llo", b"hallo"));
        assert!(!m(b"h[^e]llo", b"hello"));
        assert!(m(b"h[a-b]llo", b"hbllo"));
        assert!(m(b"news.*", b"news.tech"));
        assert!(!m(b"news.*", b"new.tech"));
        assert!(m(b"a\\*b", b"a*b"));
        assert!(!m(b"a\\*b", b"axb"));
        assert!(m(b"*a*b*c*", b"xxaxxbxxcxx"));
        assert!(!m(b"*a*b*c*d", b"xxaxxbxxcxx"));
        assert!(m(b"[", b"["));
    }
}
