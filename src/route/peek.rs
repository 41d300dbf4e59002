//! The request-body scanner: finds the top-level `model` (and `stream`, `max_tokens`, the
//! prompt's size) of an OpenAI-style JSON body without allocating or building a tree.
//!
//! It walks the top-level object key by key and skips each value as a unit: strings with
//! their escapes (`memchr` jumps to the next quote or backslash), nested objects and arrays
//! by bracket matching. So a nested `"model"` key or a `\"model\"` inside a string is never
//! mistaken for the top-level one. It checks structure (balanced brackets, terminated
//! strings, key/colon/comma order at the top level), not every JSON rule: the engine
//! validates the body fully; Spillway only needs to route it unambiguously. A repeated
//! top-level `model` key is refused, because parsers disagree on which copy wins.

use crate::http::limits::MAX_JSON_DEPTH;

/// A JSON string's raw contents (between the quotes, escapes not decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonStr<'a> {
    pub raw: &'a [u8],
    pub escaped: bool,
}

impl<'a> JsonStr<'a> {
    /// The string's bytes if it holds no escapes; otherwise decodes into `scratch`.
    pub fn decoded<'s>(&self, scratch: &'s mut Vec<u8>) -> Result<&'s [u8], PeekError>
    where
        'a: 's,
    {
        if !self.escaped {
            return Ok(self.raw);
        }
        scratch.clear();
        self.decode_with(|part| scratch.extend_from_slice(part))?;
        Ok(scratch)
    }

    /// Equality with `lit` after decoding escapes, without allocating.
    pub fn is(&self, lit: &[u8]) -> bool {
        if !self.escaped {
            return self.raw == lit;
        }
        let (mut at, mut same) = (0, true);
        let decoded = self.decode_with(|part| {
            same = same && lit.get(at..at + part.len()) == Some(part);
            at += part.len();
        });
        decoded.is_ok() && same && at == lit.len()
    }

    /// Feeds the decoded string to `out` piece by piece.
    fn decode_with(&self, mut out: impl FnMut(&[u8])) -> Result<(), PeekError> {
        let mut rest = self.raw;
        while let Some(i) = memchr::memchr(b'\\', rest) {
            out(&rest[..i]);
            let (decoded, used) = unescape(&rest[i..])?;
            let mut utf8 = [0u8; 4];
            out(decoded.encode_utf8(&mut utf8).as_bytes());
            rest = &rest[i + used..];
        }
        out(rest);
        Ok(())
    }
}

/// Decodes the escape at the start of `s` (which begins with a backslash).
fn unescape(s: &[u8]) -> Result<(char, usize), PeekError> {
    let simple = match s.get(1) {
        Some(b'"') => '"',
        Some(b'\\') => '\\',
        Some(b'/') => '/',
        Some(b'b') => '\u{8}',
        Some(b'f') => '\u{c}',
        Some(b'n') => '\n',
        Some(b'r') => '\r',
        Some(b't') => '\t',
        Some(b'u') => {
            let code = hex4(s.get(2..6))?;
            if !(0xd800..0xdc00).contains(&code) {
                return char::from_u32(code)
                    .map(|c| (c, 6))
                    .ok_or(PeekError::BadEscape);
            }
            if s.get(6..8) != Some(b"\\u") {
                return Err(PeekError::BadEscape);
            }
            let low = hex4(s.get(8..12))?;
            if !(0xdc00..0xe000).contains(&low) {
                return Err(PeekError::BadEscape);
            }
            let code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
            return char::from_u32(code)
                .map(|c| (c, 12))
                .ok_or(PeekError::BadEscape);
        }
        _ => return Err(PeekError::BadEscape),
    };
    Ok((simple, 2))
}

fn hex4(digits: Option<&[u8]>) -> Result<u32, PeekError> {
    let digits = digits.ok_or(PeekError::BadEscape)?;
    digits.iter().try_fold(0u32, |v, &c| {
        let d = (c as char).to_digit(16).ok_or(PeekError::BadEscape)?;
        Ok(v * 16 + d)
    })
}

/// What routing and load tracking need from a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestPeek<'a> {
    pub model: Option<JsonStr<'a>>,
    /// `"stream": true` at the top level.
    pub stream: bool,
    /// Bytes of the `messages`, `prompt` or `input` value: the prompt-size estimate's input.
    pub prompt_bytes: usize,
    /// Where the first of those values lies in the body (start, end): what `kv` routing
    /// hashes ([`prompt_parts`]).
    pub prompt: Option<(usize, usize)>,
    /// `max_completion_tokens`, else `max_tokens`, when a non-negative integer.
    pub max_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeekError {
    #[error("request body is not a JSON object")]
    NotObject,
    #[error("request body is not valid JSON")]
    Syntax,
    #[error("request body nests deeper than 128 levels")]
    TooDeep,
    #[error("invalid escape in a JSON string")]
    BadEscape,
    #[error("`model` must be a string")]
    ModelNotString,
    #[error("`model` appears more than once")]
    DuplicateModel,
}

struct Scanner<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    #[inline]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.buf.get(self.pos) {
            self.pos += 1;
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    fn expect(&mut self, b: u8) -> Result<(), PeekError> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(PeekError::Syntax)
        }
    }

    /// At an opening quote: consumes the string, returns its raw contents.
    fn string(&mut self) -> Result<JsonStr<'a>, PeekError> {
        self.expect(b'"')?;
        let start = self.pos;
        let mut escaped = false;
        loop {
            let rest = &self.buf[self.pos..];
            let Some(i) = memchr::memchr2(b'"', b'\\', rest) else {
                return Err(PeekError::Syntax);
            };
            self.pos += i;
            if self.buf[self.pos] == b'"' {
                let raw = &self.buf[start..self.pos];
                self.pos += 1;
                return Ok(JsonStr { raw, escaped });
            }
            escaped = true;
            match self.buf.get(self.pos + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.pos += 2,
                Some(b'u') => {
                    let hex = self
                        .buf
                        .get(self.pos + 2..self.pos + 6)
                        .ok_or(PeekError::Syntax)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return Err(PeekError::BadEscape);
                    }
                    self.pos += 6;
                }
                _ => return Err(PeekError::BadEscape),
            }
        }
    }

    /// A bare scalar (number, true, false, null): consumes it and returns its text.
    fn scalar(&mut self) -> Result<&'a [u8], PeekError> {
        let start = self.pos;
        while let Some(b'a'..=b'z' | b'0'..=b'9' | b'-' | b'+' | b'.' | b'E') = self.peek() {
            self.pos += 1;
        }
        let tok = &self.buf[start..self.pos];
        let ok = match tok.first() {
            Some(b't') => tok == b"true",
            Some(b'f') => tok == b"false",
            Some(b'n') => tok == b"null",
            Some(b'-' | b'0'..=b'9') => tok[1..]
                .iter()
                .all(|c| !c.is_ascii_lowercase() || *c == b'e'),
            _ => false,
        };
        if ok { Ok(tok) } else { Err(PeekError::Syntax) }
    }

    /// At an opening bracket: skips the whole container. Structure inside is checked by
    /// bracket matching (a bit stack of object/array) and string termination.
    fn container(&mut self) -> Result<(), PeekError> {
        let mut stack: u128 = 0; // bit set = object
        let mut depth: u32 = 0;
        loop {
            let Some(b) = self.peek() else {
                return Err(PeekError::Syntax);
            };
            match b {
                b'"' => {
                    self.string()?;
                    continue;
                }
                b'{' | b'[' => {
                    depth += 1;
                    if depth > MAX_JSON_DEPTH - 1 {
                        return Err(PeekError::TooDeep);
                    }
                    stack = (stack << 1) | u128::from(b == b'{');
                }
                b'}' | b']' => {
                    if depth == 0 || (stack & 1 == 1) != (b == b'}') {
                        return Err(PeekError::Syntax);
                    }
                    stack >>= 1;
                    depth -= 1;
                    if depth == 0 {
                        self.pos += 1;
                        return Ok(());
                    }
                }
                _ => {}
            }
            self.pos += 1;
        }
    }

    fn value(&mut self) -> Result<Value<'a>, PeekError> {
        match self.peek() {
            Some(b'"') => self.string().map(Value::Str),
            Some(b'{' | b'[') => self.container().map(|()| Value::Container),
            Some(_) => self.scalar().map(Value::Scalar),
            None => Err(PeekError::Syntax),
        }
    }
}

/// The top-level keys the scanner cares about; escaped spellings count too, since the
/// engine's parser decodes them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Model,
    Stream,
    Prompt,
    MaxTokens,
    MaxCompletionTokens,
    Other,
}

impl Key {
    fn of(k: &JsonStr<'_>) -> Key {
        const KEYS: [(&[u8], Key); 7] = [
            (b"model", Key::Model),
            (b"stream", Key::Stream),
            (b"messages", Key::Prompt),
            (b"prompt", Key::Prompt),
            (b"input", Key::Prompt),
            (b"max_tokens", Key::MaxTokens),
            (b"max_completion_tokens", Key::MaxCompletionTokens),
        ];
        KEYS.iter()
            .find(|(lit, _)| k.is(lit))
            .map_or(Key::Other, |(_, key)| *key)
    }
}

#[derive(Clone, Copy)]
enum Value<'a> {
    Str(JsonStr<'a>),
    Scalar(&'a [u8]),
    Container,
}

/// One member of a body's top-level object.
pub struct Member<'a> {
    pub key: JsonStr<'a>,
    /// The member's bytes, from its key's opening quote to the end of its value.
    pub span: (usize, usize),
    /// Where its value starts.
    pub value_at: usize,
    value: Value<'a>,
}

/// Walks the top-level object of `body` member by member, in order, checking its
/// structure as [`peek`] does; `each` may stop the walk with an error. Allocates nothing.
pub fn walk<'a>(
    body: &'a [u8],
    mut each: impl FnMut(Member<'a>) -> Result<(), PeekError>,
) -> Result<(), PeekError> {
    let mut s = Scanner { buf: body, pos: 0 };
    s.skip_ws();
    if s.peek() != Some(b'{') {
        return Err(PeekError::NotObject);
    }
    s.pos += 1;
    s.skip_ws();
    if s.peek() == Some(b'}') {
        s.pos += 1;
    } else {
        loop {
            s.skip_ws();
            let start = s.pos;
            let key = s.string()?;
            s.skip_ws();
            s.expect(b':')?;
            s.skip_ws();
            let value_at = s.pos;
            let value = s.value()?;
            let span = (start, s.pos);
            each(Member {
                key,
                span,
                value_at,
                value,
            })?;
            s.skip_ws();
            match s.peek() {
                Some(b',') => s.pos += 1,
                Some(b'}') => {
                    s.pos += 1;
                    break;
                }
                _ => return Err(PeekError::Syntax),
            }
        }
    }
    s.skip_ws();
    if s.pos != body.len() {
        return Err(PeekError::Syntax);
    }
    Ok(())
}

/// Scans a body for the fields Spillway routes on. Allocates nothing.
pub fn peek(body: &[u8]) -> Result<RequestPeek<'_>, PeekError> {
    let mut out = RequestPeek::default();
    let mut max_completion = None;
    walk(body, |m| {
        match (Key::of(&m.key), m.value) {
            (Key::Model, Value::Str(_)) if out.model.is_some() => {
                return Err(PeekError::DuplicateModel);
            }
            (Key::Model, Value::Str(v)) => out.model = Some(v),
            (Key::Model, _) => return Err(PeekError::ModelNotString),
            (Key::Stream, Value::Scalar(v)) => out.stream = v == b"true",
            (Key::Prompt, _) => {
                out.prompt_bytes += m.span.1 - m.value_at;
                out.prompt.get_or_insert((m.value_at, m.span.1));
            }
            (Key::MaxTokens, Value::Scalar(v)) => out.max_tokens = parse_u64(v),
            (Key::MaxCompletionTokens, Value::Scalar(v)) => max_completion = parse_u64(v),
            _ => {}
        }
        Ok(())
    })?;
    out.max_tokens = max_completion.or(out.max_tokens);
    Ok(out)
}

/// Feeds the parts of a prompt value that make its identity to `out`, in order, without
/// allocating: for a `messages` array, each message's `role` and `content` (raw JSON
/// text: a string's contents as sent, escapes and all, or a structured content's whole
/// text), each followed by a separator byte; for any other value (a `prompt` string or
/// array, an `input`), its raw text. Two prompts that share a leading part (a system
/// prompt, a conversation's history) feed the same leading bytes. `value` is a span found
/// by [`peek`], so it is well formed.
pub fn prompt_parts(value: &[u8], mut out: impl FnMut(&[u8])) {
    let mut s = Scanner { buf: value, pos: 0 };
    let walked = s.peek() == Some(b'[') && messages(&mut s, &mut out).is_ok();
    if !walked {
        out(value);
    }
}

/// Separators between a message's parts and after each message: bytes that never occur
/// raw inside JSON text, so part boundaries stay unambiguous.
pub const PART_END: u8 = 0x1e;
pub const MESSAGE_END: u8 = 0x1f;

/// A `messages` array: objects whose `role` and `content` are fed; anything else in the
/// array (not an object) makes the caller hash the raw text instead.
fn messages(s: &mut Scanner<'_>, out: &mut impl FnMut(&[u8])) -> Result<(), PeekError> {
    s.expect(b'[')?;
    loop {
        s.skip_ws();
        match s.peek() {
            Some(b']') => return Ok(()),
            Some(b'{') => message(s, out)?,
            _ => return Err(PeekError::Syntax),
        }
        s.skip_ws();
        if s.peek() == Some(b',') {
            s.pos += 1;
        }
    }
}

fn message(s: &mut Scanner<'_>, out: &mut impl FnMut(&[u8])) -> Result<(), PeekError> {
    let (mut role, mut content): (&[u8], &[u8]) = (b"", b"");
    s.expect(b'{')?;
    loop {
        s.skip_ws();
        if s.peek() == Some(b'}') {
            s.pos += 1;
            break;
        }
        let key = s.string()?;
        s.skip_ws();
        s.expect(b':')?;
        s.skip_ws();
        let start = s.pos;
        let value = s.value()?;
        let raw = match value {
            Value::Str(v) => v.raw,
            _ => &s.buf[start..s.pos],
        };
        if key.is(b"role") {
            role = raw;
        } else if key.is(b"content") {
            content = raw;
        }
        s.skip_ws();
        if s.peek() == Some(b',') {
            s.pos += 1;
        }
    }
    out(role);
    out(&[PART_END]);
    out(content);
    out(&[MESSAGE_END]);
    Ok(())
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |a, &d| a * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests;
