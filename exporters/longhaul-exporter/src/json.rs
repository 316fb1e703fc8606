//! A streaming JSON reader with bounds: it pulls values from any
//! [`io::Read`] through a fixed window ([`WINDOW`]), so what it holds never
//! depends on the size of the answer, only on the longest string or number
//! it keeps ([`MAX_TOKEN`]). The engine collector walks the stats API's
//! answer with it and keeps only what it exports, instead of building the
//! whole answer as a tree first (docs/visibility.md, "What a scrape costs").
//!
//! The caller drives it after the shape it expects: [`Reader::begin_object`]
//! then [`Object::key`] until `None`, [`Reader::begin_array`] then
//! [`Array::next`] until `false`, [`Reader::string`], [`Reader::u64`],
//! [`Reader::f64`], [`Reader::bool`], and [`Reader::skip`] for whatever it
//! does not need. Anything else than the expected shape is an error naming
//! the byte offset; so is an answer longer than its limit.

use std::io::{self, Read};

/// Bytes held from the source at once.
pub const WINDOW: usize = 64 << 10;
/// Longest string or number the reader hands out (label values: session
/// ids, host names, addresses, device names are far shorter). Longer ones
/// are an error, so no answer can make the reader hold more than this.
pub const MAX_TOKEN: usize = 4096;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("answer larger than {0} bytes")]
    TooLarge(u64),
    #[error("reading the answer: {0}")]
    Io(#[from] io::Error),
    #[error("not the expected JSON at byte {at}: {what}")]
    Syntax { at: u64, what: String },
}

pub type Result<T> = std::result::Result<T, Error>;

/// The reader; see the module documentation.
pub struct Reader<R> {
    src: R,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// Bytes of the answer before `buf[0]`.
    before: u64,
    limit: u64,
    eof: bool,
    /// An unescaped string (only strings with escapes go through here).
    scratch: String,
}

/// `v` with the decimal digit `b` appended; None beyond 64 bits.
#[inline]
fn with_digit(v: u64, b: u8) -> Option<u64> {
    v.checked_mul(10)?.checked_add(u64::from(b - b'0'))
}

#[inline]
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

impl<R: Read> Reader<R> {
    /// Reads at most `limit` bytes of `src`.
    pub fn new(src: R, limit: u64) -> Reader<R> {
        Reader {
            src,
            buf: vec![0u8; WINDOW].into_boxed_slice(),
            pos: 0,
            end: 0,
            before: 0,
            limit,
            eof: false,
            scratch: String::new(),
        }
    }

    fn offset(&self) -> u64 {
        self.before + self.pos as u64
    }

    /// An error naming `what` was found at the current place.
    pub fn error<T>(&self, what: impl Into<String>) -> Result<T> {
        self.syntax(what)
    }

    fn syntax<T>(&self, what: impl Into<String>) -> Result<T> {
        Err(Error::Syntax {
            at: self.offset(),
            what: what.into(),
        })
    }

    /// Moves the unread bytes to the front and reads more after them;
    /// false at the end of the answer.
    fn fill(&mut self) -> Result<bool> {
        if self.eof {
            return Ok(false);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.before += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        if self.end == self.buf.len() {
            return Ok(true);
        }
        loop {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end += n;
                    if self.before + self.end as u64 > self.limit {
                        return Err(Error::TooLarge(self.limit));
                    }
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::Io(e)),
            }
        }
    }

    /// The next byte that is not white space, not consumed.
    #[inline]
    fn peek(&mut self) -> Result<u8> {
        // Nearly always the very next byte (the engine writes no spaces).
        if let Some(&b) = self.buf[..self.end].get(self.pos) {
            if !is_space(b) {
                return Ok(b);
            }
        }
        self.peek_further()
    }

    #[cold]
    fn peek_further(&mut self) -> Result<u8> {
        loop {
            while self.pos < self.end {
                let b = self.buf[self.pos];
                if !is_space(b) {
                    return Ok(b);
                }
                self.pos += 1;
            }
            if !self.fill()? {
                return self.syntax("the answer ends early");
            }
        }
    }

    #[inline]
    fn expect(&mut self, want: u8) -> Result<()> {
        let b = self.peek()?;
        if b != want {
            return self.syntax(format!("{:?} where {:?} belongs", b as char, want as char));
        }
        self.pos += 1;
        Ok(())
    }

    /// Whether the next value is `null` (consumed if so).
    pub fn null(&mut self) -> Result<bool> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn literal(&mut self, word: &[u8]) -> Result<()> {
        while self.end - self.pos < word.len() {
            if !self.fill()? {
                return self.syntax("the answer ends early");
            }
        }
        if &self.buf[self.pos..self.pos + word.len()] != word {
            return self.syntax("not a JSON value");
        }
        self.pos += word.len();
        Ok(())
    }

    pub fn bool(&mut self) -> Result<bool> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|_| true),
            b'f' => self.literal(b"false").map(|_| false),
            _ => self.syntax("not a boolean"),
        }
    }

    /// `{`: then [`Object::key`] until it returns `None`.
    pub fn begin_object(&mut self) -> Result<Object> {
        self.expect(b'{')?;
        Ok(Object { first: true })
    }

    /// `[`: then [`Array::next`] until it returns `false`.
    pub fn begin_array(&mut self) -> Result<Array> {
        self.expect(b'[')?;
        Ok(Array { first: true })
    }

    /// The bytes of a number token (at most [`MAX_TOKEN`]).
    fn number_token(&mut self) -> Result<(usize, usize)> {
        self.peek()?;
        let mut len = 0;
        loop {
            while self.pos + len < self.end {
                let b = self.buf[self.pos + len];
                if !(b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')) {
                    return if len == 0 {
                        self.syntax("not a number")
                    } else {
                        Ok((self.pos, len))
                    };
                }
                len += 1;
                if len > MAX_TOKEN {
                    return self.syntax("a number too long");
                }
            }
            if !self.fill()? {
                return if len == 0 {
                    self.syntax("the answer ends early")
                } else {
                    Ok((self.pos, len))
                };
            }
        }
    }

    /// A whole number >= 0.
    #[inline]
    pub fn u64(&mut self) -> Result<u64> {
        // One pass over a number that ends within the window (nearly every
        // one: the stats answer is mostly such numbers); anything else, a
        // number cut by the window's end, too long or not whole, is taken
        // by the token reader below, which says what is wrong.
        self.peek()?;
        let digits = &self.buf[self.pos..self.end];
        let mut v: u64 = 0;
        for (i, &b) in digits.iter().enumerate().take(20) {
            if b.is_ascii_digit() {
                match with_digit(v, b) {
                    Some(n) => v = n,
                    None => break,
                }
            } else {
                if i > 0 && !matches!(b, b'.' | b'e' | b'E' | b'+' | b'-') {
                    self.pos += i;
                    return Ok(v);
                }
                break;
            }
        }
        self.u64_token()
    }

    /// [`Reader::u64`] of any token, saying what is wrong with it.
    #[cold]
    fn u64_token(&mut self) -> Result<u64> {
        let (start, len) = self.number_token()?;
        let token = &self.buf[start..start + len];
        let mut v: u64 = 0;
        for &b in token {
            if !b.is_ascii_digit() {
                return self.syntax("not a whole number >= 0");
            }
            v = match with_digit(v, b) {
                Some(v) => v,
                None => return self.syntax("a number beyond 64 bits"),
            };
        }
        self.pos = start + len;
        Ok(v)
    }

    pub fn u32(&mut self) -> Result<u32> {
        let v = self.u64()?;
        u32::try_from(v).or_else(|_| self.syntax("a number beyond 32 bits"))
    }

    pub fn f64(&mut self) -> Result<f64> {
        let (start, len) = self.number_token()?;
        let v = std::str::from_utf8(&self.buf[start..start + len])
            .ok()
            .and_then(|t| t.parse::<f64>().ok());
        match v {
            Some(v) => {
                self.pos = start + len;
                Ok(v)
            }
            None => self.syntax("not a number"),
        }
    }

    /// A string (at most [`MAX_TOKEN`] bytes as written), unescaped.
    pub fn string(&mut self) -> Result<&str> {
        let start = self.pos;
        match self.plain_string()? {
            Some((at, len)) => match std::str::from_utf8(&self.buf[at..at + len]) {
                Ok(s) => Ok(s),
                Err(_) => {
                    self.pos = start;
                    self.syntax("a string that is not UTF-8")
                }
            },
            None => self.escaped_string(),
        }
    }

    /// A string's bytes as written, not checked for UTF-8: for keys and
    /// words compared with known ones. An escaped string is unescaped.
    pub fn raw_string(&mut self) -> Result<&[u8]> {
        match self.plain_string()? {
            Some((at, len)) => Ok(&self.buf[at..at + len]),
            None => Ok(self.escaped_string()?.as_bytes()),
        }
    }

    /// Consumes a string without escapes and returns where its bytes are;
    /// None (nothing consumed but the opening quote) when it has escapes.
    fn plain_string(&mut self) -> Result<Option<(usize, usize)>> {
        self.expect(b'"')?;
        let mut len = 0;
        loop {
            let window = &self.buf[self.pos + len..self.end];
            match window
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
            {
                Some(i) => {
                    len += i;
                    if len > MAX_TOKEN {
                        return self.syntax("a string too long");
                    }
                    match self.buf[self.pos + len] {
                        b'"' => {
                            let at = self.pos;
                            self.pos += len + 1;
                            return Ok(Some((at, len)));
                        }
                        b'\\' => return Ok(None),
                        _ => {
                            self.pos += len;
                            return self.syntax("a control character in a string");
                        }
                    }
                }
                None => {
                    len += window.len();
                    if len > MAX_TOKEN {
                        return self.syntax("a string too long");
                    }
                    if !self.fill()? {
                        return self.syntax("the answer ends early");
                    }
                }
            }
        }
    }

    /// A string with escapes, from after its opening quote.
    fn escaped_string(&mut self) -> Result<&str> {
        let mut raw: Vec<u8> = Vec::new();
        loop {
            if self.pos == self.end && !self.fill()? {
                return self.syntax("the answer ends early");
            }
            let b = self.buf[self.pos];
            self.pos += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    if self.pos == self.end && !self.fill()? {
                        return self.syntax("the answer ends early");
                    }
                    let e = self.buf[self.pos];
                    self.pos += 1;
                    match e {
                        b'"' | b'\\' | b'/' => raw.push(e),
                        b'b' => raw.push(8),
                        b'f' => raw.push(12),
                        b'n' => raw.push(b'\n'),
                        b'r' => raw.push(b'\r'),
                        b't' => raw.push(b'\t'),
                        b'u' => {
                            let c = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&c) {
                                self.expect_raw(b"\\u")?;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return self.syntax("a lone surrogate in a string");
                                }
                                0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00)
                            } else {
                                c
                            };
                            match char::from_u32(c) {
                                Some(ch) => {
                                    let mut tmp = [0u8; 4];
                                    raw.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
                                }
                                None => return self.syntax("a lone surrogate in a string"),
                            }
                        }
                        _ => return self.syntax("a bad escape in a string"),
                    }
                }
                b if b < 0x20 => return self.syntax("a control character in a string"),
                b => raw.push(b),
            }
            if raw.len() > MAX_TOKEN {
                return self.syntax("a string too long");
            }
        }
        match String::from_utf8(raw) {
            Ok(s) => {
                self.scratch = s;
                Ok(&self.scratch)
            }
            Err(_) => self.syntax("a string that is not UTF-8"),
        }
    }

    fn expect_raw(&mut self, bytes: &[u8]) -> Result<()> {
        for &want in bytes {
            if self.pos == self.end && !self.fill()? {
                return self.syntax("the answer ends early");
            }
            if self.buf[self.pos] != want {
                return self.syntax("a lone surrogate in a string");
            }
            self.pos += 1;
        }
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32> {
        let mut v = 0;
        for _ in 0..4 {
            if self.pos == self.end && !self.fill()? {
                return self.syntax("the answer ends early");
            }
            let d = match (self.buf[self.pos] as char).to_digit(16) {
                Some(d) => d,
                None => return self.syntax("a bad \\u escape in a string"),
            };
            self.pos += 1;
            v = v * 16 + d;
        }
        Ok(v)
    }

    /// Skips one value of any kind and size, holding nothing of it.
    pub fn skip(&mut self) -> Result<()> {
        let mut depth: u64 = 0;
        loop {
            match self.peek()? {
                b'{' | b'[' => {
                    depth += 1;
                    self.pos += 1;
                    continue;
                }
                b'}' | b']' if depth > 0 => {
                    depth -= 1;
                    self.pos += 1;
                }
                b',' | b':' if depth > 0 => {
                    self.pos += 1;
                    continue;
                }
                b'"' => self.skip_string()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => {
                    self.number_token()
                        .map(|(start, len)| self.pos = start + len)?;
                }
            }
            if depth == 0 {
                return Ok(());
            }
        }
    }

    fn skip_string(&mut self) -> Result<()> {
        self.pos += 1;
        loop {
            while self.pos < self.end {
                match self.buf[self.pos] {
                    b'"' => {
                        self.pos += 1;
                        return Ok(());
                    }
                    b'\\' => {
                        self.pos += 1;
                        if self.pos == self.end && !self.fill()? {
                            return self.syntax("the answer ends early");
                        }
                        self.pos += 1;
                    }
                    _ => self.pos += 1,
                }
            }
            if !self.fill()? {
                return self.syntax("the answer ends early");
            }
        }
    }

    /// Nothing but white space may follow the value.
    pub fn finish(&mut self) -> Result<()> {
        loop {
            while self.pos < self.end {
                if !is_space(self.buf[self.pos]) {
                    return self.syntax("more after the answer");
                }
                self.pos += 1;
            }
            if !self.fill()? {
                return Ok(());
            }
        }
    }
}

/// An object being read.
pub struct Object {
    first: bool,
}

impl Object {
    /// The next key, or `None` after the closing `}`.
    pub fn key<R: Read>(&mut self, r: &mut Reader<R>) -> Result<Option<Key>> {
        let b = r.peek()?;
        if b == b'}' {
            r.pos += 1;
            return Ok(None);
        }
        if !self.first {
            r.expect(b',')?;
        }
        self.first = false;
        let key = Key::of(r.raw_string()?);
        r.expect(b':')?;
        Ok(Some(key))
    }
}

/// An object's key, copied out of the window (keys are short; a longer one
/// than [`Key::MAX`] is kept as the empty key, which names no field).
#[derive(Clone, Copy)]
pub struct Key {
    len: usize,
    bytes: [u8; Key::MAX],
}

impl Key {
    pub const MAX: usize = 32;

    fn of(s: &[u8]) -> Key {
        let mut k = Key {
            len: 0,
            bytes: [0; Key::MAX],
        };
        if s.len() <= Key::MAX {
            k.bytes[..s.len()].copy_from_slice(s);
            k.len = s.len();
        }
        k
    }

    /// The key, or "" if it is not UTF-8 (no field is named so).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }
}

/// An array being read.
pub struct Array {
    first: bool,
}

impl Array {
    /// Whether another element follows (false after the closing `]`).
    #[inline]
    pub fn next<R: Read>(&mut self, r: &mut Reader<R>) -> Result<bool> {
        let b = r.peek()?;
        if b == b']' {
            r.pos += 1;
            return Ok(false);
        }
        if !self.first {
            r.expect(b',')?;
        }
        self.first = false;
        Ok(true)
    }

    /// The next element, which must be there: an error saying `what` is
    /// missing after the closing `]`.
    pub fn required<R: Read>(&mut self, r: &mut Reader<R>, what: &str) -> Result<()> {
        if self.next(r)? {
            Ok(())
        } else {
            r.error(what)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that hands out at most `n` bytes per read, so every token
    /// crosses a window refill somewhere.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(out.len()).min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn walk<R: Read>(r: &mut Reader<R>) -> Result<Vec<String>> {
        let mut seen = Vec::new();
        let mut o = r.begin_object()?;
        while let Some(k) = o.key(r)? {
            let k = k.as_str().to_string();
            match k.as_str() {
                "n" => seen.push(format!("n={}", r.u64()?)),
                "f" => seen.push(format!("f={}", r.f64()?)),
                "s" => seen.push(format!("s={}", r.string()?)),
                "b" => seen.push(format!("b={}", r.bool()?)),
                "a" => {
                    let mut a = r.begin_array()?;
                    while a.next(r)? {
                        seen.push(format!("a={}", r.u64()?));
                    }
                }
                _ => {
                    r.skip()?;
                    seen.push(format!("skipped {k}"));
                }
            }
        }
        r.finish()?;
        Ok(seen)
    }

    const DOC: &str = r#" { "n": 18446744073709551615, "f": -1.5e3, "s": "a\"b\\c\u00e9\ud83d\ude00",
        "x": {"deep": [1, {"y": "}]"}, null, true, false, -2.5e-3]}, "b": true,
        "a": [1,2 , 3], "e": [] } "#;

    #[test]
    fn values_of_every_kind_whatever_the_read_sizes() {
        let want = vec![
            "n=18446744073709551615".to_string(),
            "f=-1500".into(),
            "s=a\"b\\c\u{e9}\u{1F600}".into(),
            "skipped x".into(),
            "b=true".into(),
            "a=1".into(),
            "a=2".into(),
            "a=3".into(),
            "skipped e".into(),
        ];
        for step in [1, 2, 3, 7, 4096] {
            let mut r = Reader::new(Trickle(DOC.as_bytes(), step), 1 << 20);
            assert_eq!(walk(&mut r).unwrap(), want, "reads of {step} bytes");
        }
    }

    #[test]
    fn bad_answers_are_errors_naming_the_place() {
        for (doc, needle) in [
            ("<html>", "'<' where '{' belongs"),
            (r#"{"n": -1}"#, "not a whole number"),
            (r#"{"n": 99999999999999999999}"#, "beyond 64 bits"),
            (r#"{"a": "nope"}"#, "where '[' belongs"),
            (r#"{"n": 1 "s": "x"}"#, "where ',' belongs"),
            (r#"{"s": "x"#, "ends early"),
            (r#"{"s": "\x"}"#, "bad escape"),
            ("{\"s\": \"a\u{1}\"}", "control character"),
            (r#"{"n": 1} x"#, "more after the answer"),
            (r#"{"b": tru}"#, "not a JSON value"),
        ] {
            let mut r = Reader::new(doc.as_bytes(), 1 << 20);
            let e = walk(&mut r).unwrap_err().to_string();
            assert!(e.contains(needle), "{doc}: {e}");
            assert!(e.contains("at byte"), "{doc}: {e}");
        }
    }

    #[test]
    fn long_strings_and_long_answers_are_refused_not_held() {
        let long = format!(r#"{{"s": "{}"}}"#, "x".repeat(MAX_TOKEN + 1));
        let e = walk(&mut Reader::new(long.as_bytes(), 1 << 20)).unwrap_err();
        assert!(e.to_string().contains("too long"), "{e}");
        // A string nobody keeps may be as long as the answer may be.
        let skipped = format!(r#"{{"x": "{}"}}"#, "x".repeat(3 * WINDOW));
        assert_eq!(
            walk(&mut Reader::new(skipped.as_bytes(), 1 << 20)).unwrap(),
            ["skipped x"]
        );
        // An endless answer stops at the limit.
        let endless = io::repeat(b' ');
        let e = walk(&mut Reader::new(endless, 1 << 20)).unwrap_err();
        assert!(matches!(e, Error::TooLarge(n) if n == 1 << 20), "{e}");
    }
}
