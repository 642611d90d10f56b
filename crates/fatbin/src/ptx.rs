//! PTX `.entry` signatures → parameter layouts (FATBIN.md §5).
//!
//! Only what a layout needs is read: `.version`, `.target`, and each `.entry` with its
//! parameter list and `.maxntid` / `.reqntid`. Offsets follow natural-alignment packing in
//! declaration order, which is what ptxas writes into `EIATTR_KPARAM_INFO`.

use crate::error::{Error, Result};
use crate::{KernelInfo, ParamInfo, Source};

/// What a PTX module declares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PtxModule {
    /// `.version major.minor`.
    pub version: Option<(u32, u32)>,
    /// SM number of `.target sm_XX[a|f]`.
    pub target_sm: Option<u32>,
    /// Every `.entry` (declarations without a body are skipped), in order, with
    /// [`KernelInfo::sm`] = [`PtxModule::target_sm`] and [`KernelInfo::source`] = [`Source::Ptx`].
    pub kernels: Vec<KernelInfo>,
}

#[derive(Debug, Clone, Copy)]
struct Tok<'a> {
    at: usize,
    text: &'a [u8],
}

/// Splits PTX into tokens, dropping comments, white space and string literals.
struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Tok<'a>;
    fn next(&mut self) -> Option<Tok<'a>> {
        let s = self.src;
        loop {
            let c = *s.get(self.pos)?;
            if c.is_ascii_whitespace() || c == 0 {
                self.pos += 1;
            } else if s[self.pos..].starts_with(b"//") {
                self.pos = s[self.pos..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(s.len(), |n| self.pos + n);
            } else if s[self.pos..].starts_with(b"/*") {
                self.pos = s[self.pos + 2..]
                    .windows(2)
                    .position(|w| w == b"*/")
                    .map_or(s.len(), |n| self.pos + 2 + n + 2);
            } else if c == b'"' {
                self.pos = s[self.pos + 1..]
                    .iter()
                    .position(|&b| b == b'"')
                    .map_or(s.len(), |n| self.pos + 1 + n + 1);
            } else {
                break;
            }
        }
        let start = self.pos;
        let is_word = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$' | b'%');
        if is_word(s[start]) {
            while self.pos < s.len() && is_word(s[self.pos]) {
                self.pos += 1;
            }
        } else {
            self.pos += 1;
        }
        Some(Tok {
            at: start,
            text: &s[start..self.pos],
        })
    }
}

struct Parser<'a> {
    lex: std::iter::Peekable<Lexer<'a>>,
    end: usize,
}

impl<'a> Parser<'a> {
    fn next_tok(&mut self, expected: &'static str) -> Result<Tok<'a>> {
        self.lex.next().ok_or(Error::Ptx {
            offset: self.end as u64,
            found: "end of input".into(),
            expected,
        })
    }
    fn expect(&mut self, text: &[u8], expected: &'static str) -> Result<Tok<'a>> {
        let t = self.next_tok(expected)?;
        if t.text != text {
            return Err(bad(t, expected));
        }
        Ok(t)
    }
    fn peek_is(&mut self, text: &[u8]) -> bool {
        self.lex.peek().is_some_and(|t| t.text == text)
    }
    fn number(&mut self, expected: &'static str) -> Result<u32> {
        let t = self.next_tok(expected)?;
        parse_u32(t.text).ok_or_else(|| bad(t, expected))
    }
}

fn bad(t: Tok<'_>, expected: &'static str) -> Error {
    Error::Ptx {
        offset: t.at as u64,
        found: String::from_utf8_lossy(&t.text[..t.text.len().min(64)]).into_owned(),
        expected,
    }
}

fn parse_u32(text: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(text).ok()?;
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Size in bytes of a PTX fundamental type.
fn type_size(t: &[u8]) -> Option<u32> {
    Some(match t {
        b".b8" | b".u8" | b".s8" => 1,
        b".b16" | b".u16" | b".s16" | b".f16" | b".bf16" => 2,
        b".b32" | b".u32" | b".s32" | b".f32" | b".f16x2" | b".bf16x2" => 4,
        b".b64" | b".u64" | b".s64" | b".f64" => 8,
        b".b128" => 16,
        _ => return None,
    })
}

/// Parses PTX text (a trailing NUL and anything after it are ignored).
pub fn parse_ptx(text: &[u8]) -> Result<PtxModule> {
    let text = match text.iter().position(|&b| b == 0) {
        Some(nul) => &text[..nul],
        None => text,
    };
    let mut p = Parser {
        lex: Lexer { src: text, pos: 0 }.peekable(),
        end: text.len(),
    };
    let mut module = PtxModule::default();
    while let Some(t) = p.lex.next() {
        match t.text {
            b".version" => {
                let v = p.next_tok("a version number")?;
                let s = std::str::from_utf8(v.text).unwrap_or("");
                let (maj, min) = s.split_once('.').unwrap_or((s, "0"));
                match (maj.parse(), min.parse()) {
                    (Ok(a), Ok(b)) => module.version = Some((a, b)),
                    _ => return Err(bad(v, "a version number major.minor")),
                }
            }
            b".target" => {
                let v = p.next_tok("a target")?;
                let digits: Vec<u8> = v
                    .text
                    .strip_prefix(b"sm_")
                    .unwrap_or(b"")
                    .iter()
                    .copied()
                    .take_while(u8::is_ascii_digit)
                    .collect();
                module.target_sm = parse_u32(&digits);
            }
            b".entry" => {
                if let Some(k) = parse_entry(&mut p)? {
                    module.kernels.push(k);
                }
            }
            _ => {}
        }
    }
    for k in &mut module.kernels {
        k.sm = module.target_sm;
    }
    Ok(module)
}

/// After `.entry`: name, optional parameter list, performance directives, then `{` (a
/// kernel) or `;` (a declaration: `None`).
fn parse_entry(p: &mut Parser<'_>) -> Result<Option<KernelInfo>> {
    let name = p.next_tok("a kernel name")?;
    let mut k = KernelInfo {
        name: String::from_utf8_lossy(name.text).into_owned(),
        source: Source::Ptx,
        ..KernelInfo::default()
    };
    let mut end = 0u32;
    if p.peek_is(b"(") {
        p.next_tok("(")?;
        if p.peek_is(b")") {
            p.next_tok(")")?;
        } else {
            loop {
                let (align, size) = parse_param(p)?;
                let offset = end
                    .checked_next_multiple_of(align)
                    .ok_or_else(|| bad(name, "parameters that fit in 4 GiB"))?;
                end = offset
                    .checked_add(size)
                    .ok_or_else(|| bad(name, "parameters that fit in 4 GiB"))?;
                k.params.push(ParamInfo {
                    ordinal: k.params.len() as u32,
                    offset,
                    size,
                });
                let t = p.next_tok("',' or ')'")?;
                match t.text {
                    b"," => continue,
                    b")" => break,
                    _ => return Err(bad(t, "',' or ')' after a parameter")),
                }
            }
        }
    }
    k.param_bytes = end;
    loop {
        let t = p.next_tok("'{' or ';' after an entry signature")?;
        match t.text {
            b"{" => return Ok(Some(k)),
            b";" => return Ok(None),
            b".maxntid" | b".reqntid" => {
                let mut dims = [1u32; 3];
                for (i, d) in dims.iter_mut().enumerate() {
                    if i > 0 {
                        if !p.peek_is(b",") {
                            break;
                        }
                        p.next_tok(",")?;
                    }
                    *d = p.number("a thread count")?;
                }
                if t.text == b".maxntid" {
                    k.max_threads = Some(dims);
                } else {
                    k.reqntid = Some(dims);
                }
            }
            _ => {} // .minnctapersm, .maxnreg, .noreturn, cluster directives: not needed
        }
    }
}

/// One `.param` declaration → (alignment, size).
fn parse_param(p: &mut Parser<'_>) -> Result<(u32, u32)> {
    p.expect(b".param", "'.param'")?;
    let mut align: Option<u32> = None;
    let mut elem: Option<u32> = None;
    let mut after_ptr = false;
    loop {
        let t = p.next_tok("a parameter declaration")?;
        match t.text {
            b".align" => {
                let a = p.number("an alignment")?;
                // `.align` after `.ptr` is the pointee's alignment, not the parameter's.
                if !after_ptr && elem.is_none() {
                    align = Some(a);
                }
            }
            b".ptr" => after_ptr = true,
            b".global" | b".const" | b".local" | b".shared" => {}
            tt if tt.starts_with(b".") => {
                elem = Some(type_size(tt).ok_or_else(|| bad(t, "a PTX parameter type"))?);
            }
            _ => {
                let Some(size) = elem else {
                    return Err(bad(t, "a parameter type before the name"));
                };
                let mut count = 1u32;
                if p.peek_is(b"[") {
                    p.next_tok("[")?;
                    count = p.number("an array length")?;
                    p.expect(b"]", "']'")?;
                }
                let total = size
                    .checked_mul(count)
                    .ok_or_else(|| bad(t, "an array that fits in 4 GiB"))?;
                let align = align.unwrap_or(size).max(1);
                return Ok((align, total));
            }
        }
    }
}
