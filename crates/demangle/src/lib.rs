//! Itanium C++ demangling for kernel names, fast where it can be and `cpp_demangle` where
//! it cannot.
//!
//! [`demangle`] prints exactly what `cpp_demangle` 0.5 prints (`Symbol::new(name)?
//! .demangle()`, the name itself when that fails), at a fraction of the cost for the names
//! CUDA programs have. PyTorch's 21,132 kernel names demangle to 50 MB of text (CUTLASS's
//! nested templates); `cpp_demangle` takes 11 µs a name, which was half of `cudaw fatbin
//! --sm 90` on `libtorch_cuda.so`.
//!
//! The fast path ([`fast`]) parses the grammar that kernel names use into a flat arena and
//! prints it with `cpp_demangle`'s rules (`> >`, `(anonymous namespace)`, `{lambda(int)#1}`,
//! `(unsigned long)2`, east `const`, template parameters resolved through the same scope
//! stack). Anything outside that grammar, or any case where the two could print
//! differently (a template parameter naming the arguments being printed, deep nesting,
//! a clone suffix), makes it answer `None`, and `cpp_demangle` decides. The tests compare
//! the two on every kernel name of PyTorch 2.11 and on mutations of them.

#![forbid(unsafe_code)]

/// The demangled form of `name` as `cpp_demangle` prints it; `name` itself when it is not a
/// mangled C++ name (an `extern "C"` kernel, say).
pub fn demangle(name: &str) -> String {
    if let Some(s) = fast(name) {
        return s;
    }
    reference(name).unwrap_or_else(|| name.to_owned())
}

/// What `cpp_demangle` prints for `name`, or `None` where it fails.
pub fn reference(name: &str) -> Option<String> {
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle().ok())
}

/// The fast path alone: `Some` only where the output is known to be `cpp_demangle`'s.
pub fn fast(name: &str) -> Option<String> {
    let input = name.as_bytes();
    let mut p = Parser {
        input,
        pos: 2,
        nodes: Vec::with_capacity(input.len() / 2),
        subs: Vec::with_capacity(input.len() / 8),
        depth: 0,
    };
    if !input.starts_with(b"_Z") {
        return None;
    }
    let enc = p.encoding()?;
    if p.pos != input.len() {
        return None;
    }
    let mut out = Printer::new(&p.nodes, name);
    out.node(enc)?;
    Some(out.out)
}

/// How deep the fast path parses, in `cpp_demangle`'s parse levels (over-estimated): it
/// gives up at 96, and a name it cannot print must not be printed here either. The tests
/// grow names of every shape until each side gives up and check that the fast path always
/// gives up first.
const PARSE_LIMIT: u32 = 90;

/// The same for printing (`cpp_demangle` gives up at 128 levels).
const PRINT_LIMIT: u32 = 120;

type Id = u32;

#[derive(Debug)]
enum Node {
    /// An identifier: `input[start..end]`.
    Source(u32, u32),
    /// `{lambda(sig)#n}`: parameter types (empty for `v`) and the number.
    Closure(Vec<Id>, u32),
    /// `operator()` and the like.
    Operator(&'static str),
    /// `St`, `Sa`: printed as is.
    WellKnown(&'static str),
    /// `prefix::name`.
    Nested(Id, Id),
    /// `name<args>` (the second is an `Args`), a component of a nested name.
    Template(Id, Id),
    /// `name<args>` of an unscoped name or a substitution: `cpp_demangle` prints the name
    /// with the arguments in scope (`T_` in it names one of them).
    UnscopedTemplate(Id, Id),
    /// Template arguments.
    Args(Vec<Id>),
    /// An argument pack (`J…E`), printed inline.
    Pack(Vec<Id>),
    /// `L type value E`: the type and `input[start..end]`.
    Literal(Id, u32, u32),
    /// A builtin type's spelling.
    Builtin(&'static str),
    /// A type followed by ` const` / ` volatile` / ` restrict` (bits 1, 2, 4).
    Qualified(u8, Id),
    Pointer(Id),
    LRef(Id),
    RRef(Id),
    /// `type...`.
    PackExpansion(Id),
    /// `T_` = 0, `T0_` = 1, …
    Param(u32),
    /// `encoding::entity`.
    Local(Id, Id),
    /// A nested name (`N…E`) and its cv-qualifiers: where `cpp_demangle` prints the
    /// innermost pending suffix (a function's parameters, a `*`) and then ` const`.
    NestedName(Id, u8),
    /// A function: its name and its types (the first is the return type when the name is a
    /// template).
    Function(Id, Vec<Id>),
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    subs: Vec<Id>,
    depth: u32,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn peek2(&self) -> Option<u8> {
        self.input.get(self.pos + 1).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn push(&mut self, n: Node) -> Id {
        self.nodes.push(n);
        (self.nodes.len() - 1) as Id
    }

    /// One more level of recursion, costing `cost` of `cpp_demangle`'s parse levels (an
    /// over-estimate of the frames it spends on the same production).
    fn enter(&mut self, cost: u32) -> Option<()> {
        self.depth += cost;
        (self.depth <= PARSE_LIMIT).then_some(())
    }

    /// `[r] [V] [K]`: bits 4, 2, 1 (the order the grammar writes them).
    fn cv_qualifiers(&mut self) -> u8 {
        let mut cv = 0;
        for (c, bit) in [(b'r', 4), (b'V', 2), (b'K', 1)] {
            if self.eat(c) {
                cv |= bit;
            }
        }
        cv
    }

    /// `<encoding> ::= <name> <bare-function-type> | <name>`
    fn encoding(&mut self) -> Option<Id> {
        self.enter(2)?;
        let name = self.name()?;
        let mut types = Vec::new();
        while !matches!(self.peek(), None | Some(b'E')) {
            types.push(self.ty()?);
        }
        self.depth -= 2;
        if types.is_empty() {
            return Some(name);
        }
        Some(self.push(Node::Function(name, types)))
    }

    /// `<name>`.
    fn name(&mut self) -> Option<Id> {
        match self.peek()? {
            b'N' => self.nested(),
            b'Z' => self.local(),
            b'S' if self.peek2() == Some(b't') => {
                self.pos += 2;
                let std = self.push(Node::WellKnown("std"));
                let u = self.unqualified()?;
                let name = self.push(Node::Nested(std, u));
                self.unscoped_template(name)
            }
            b'S' => {
                // A substitution naming an unscoped template.
                let t = self.substitution()?;
                if self.peek() != Some(b'I') {
                    return None;
                }
                let args = self.template_args()?;
                Some(self.push(Node::UnscopedTemplate(t, args)))
            }
            _ => {
                let u = self.unqualified()?;
                self.unscoped_template(u)
            }
        }
    }

    /// An unscoped name, and its template arguments if any (the template name then becomes
    /// a substitution candidate).
    fn unscoped_template(&mut self, name: Id) -> Option<Id> {
        if self.peek() != Some(b'I') {
            return Some(name);
        }
        self.subs.push(name);
        let args = self.template_args()?;
        Some(self.push(Node::UnscopedTemplate(name, args)))
    }

    /// `N [CV] <prefix> <unqualified-name> E`: every component but the last becomes a
    /// substitution candidate.
    fn nested(&mut self) -> Option<Id> {
        self.enter(4)?;
        self.pos += 1;
        let cv = self.cv_qualifiers();
        if matches!(self.peek(), Some(b'R' | b'O' | b'H')) {
            return None;
        }
        let mut current: Option<Id> = None;
        // Whether `current` may take template arguments.
        let mut templatable = false;
        // Whether a name or template arguments came after a leading substitution or
        // template parameter (cpp_demangle wants one).
        let mut named = false;
        loop {
            let c = self.peek()?;
            if c == b'E' {
                self.pos += 1;
                self.depth -= 4;
                if !named {
                    return None;
                }
                let c = current?;
                return Some(self.push(Node::NestedName(c, cv)));
            }
            let next = match c {
                b'S' if current.is_none() => {
                    let s = self.substitution()?;
                    current = Some(s);
                    templatable = true;
                    continue;
                }
                b'T' if current.is_none() => {
                    let t = self.template_param()?;
                    templatable = true;
                    t
                }
                b'I' if templatable => {
                    let args = self.template_args()?;
                    templatable = false;
                    named = true;
                    self.push(Node::Template(current?, args))
                }
                _ => {
                    let u = self.unqualified()?;
                    templatable = true;
                    named = true;
                    match current {
                        None => u,
                        Some(p) => self.push(Node::Nested(p, u)),
                    }
                }
            };
            current = Some(next);
            match self.peek() {
                Some(b'E') => {}
                Some(b'M') => return None,
                _ => self.subs.push(next),
            }
        }
    }

    /// `Z <encoding> E <entity name> [<discriminator>]`.
    fn local(&mut self) -> Option<Id> {
        self.enter(3)?;
        self.pos += 1;
        let enc = self.encoding()?;
        if !self.eat(b'E') || matches!(self.peek(), Some(b's' | b'd')) {
            return None;
        }
        let entity = self.name()?;
        // A discriminator is parsed and not printed.
        if self.peek() == Some(b'_') {
            self.pos += 1;
            if self.eat(b'_') {
                // `__<n>_` only for n ≥ 10 (`_<digit>` below that), as cpp_demangle.
                if self.number()? < 10 {
                    return None;
                }
                if !self.eat(b'_') {
                    return None;
                }
            } else if !self.peek()?.is_ascii_digit() {
                return None;
            } else {
                self.pos += 1;
            }
        }
        self.depth -= 3;
        Some(self.push(Node::Local(enc, entity)))
    }

    fn number(&mut self) -> Option<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == start || (self.input[start] == b'0' && self.pos - start > 1) {
            return None;
        }
        std::str::from_utf8(&self.input[start..self.pos])
            .ok()?
            .parse()
            .ok()
    }

    /// `<unqualified-name>`: a source name, a lambda, or `operator()`.
    fn unqualified(&mut self) -> Option<Id> {
        let id = match self.peek()? {
            b'0'..=b'9' => {
                let len = self.number()? as usize;
                // A leaf, three parse levels below its parent in cpp_demangle.
                if len == 0 || self.depth + 3 > PARSE_LIMIT {
                    return None;
                }
                let start = self.pos;
                let end = start.checked_add(len)?;
                let ident = self.input.get(start..end)?;
                if !ident
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || *c == b'_')
                {
                    return None;
                }
                self.pos = end;
                self.push(Node::Source(start as u32, end as u32))
            }
            b'U' if self.peek2() == Some(b'l') => {
                self.enter(3)?;
                self.pos += 2;
                let mut sig = Vec::new();
                if !self.eat(b'v') {
                    sig.push(self.ty()?);
                    while self.peek() != Some(b'E') {
                        sig.push(self.ty()?);
                    }
                } else if self.peek() != Some(b'E') {
                    return None;
                }
                self.pos += 1;
                let n = if self.peek()?.is_ascii_digit() {
                    self.number()?.checked_add(2)?
                } else {
                    1
                };
                if !self.eat(b'_') {
                    return None;
                }
                self.depth -= 3;
                self.push(Node::Closure(sig, n))
            }
            b'c' if self.peek2() == Some(b'l') => {
                self.pos += 2;
                self.push(Node::Operator("operator()"))
            }
            _ => return None,
        };
        // ABI tags and the like are left to cpp_demangle.
        if self.peek() == Some(b'B') {
            return None;
        }
        Some(id)
    }

    /// `S_`, `S<seq-id>_`, `St`, `Sa`.
    fn substitution(&mut self) -> Option<Id> {
        self.pos += 1;
        let c = self.peek()?;
        if c == b'_' {
            self.pos += 1;
            return self.subs.first().copied();
        }
        if c == b'a' || c == b't' {
            self.pos += 1;
            let s = if c == b'a' { "std::allocator" } else { "std" };
            return Some(self.push(Node::WellKnown(s)));
        }
        // A base-36 sequence number, without leading zeros.
        if !(c.is_ascii_digit() || c.is_ascii_uppercase())
            || (c == b'0' && self.peek2().is_some_and(|d| d != b'_'))
        {
            return None;
        }
        let mut n: usize = 0;
        while let Some(c) = self.peek() {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'A'..=b'Z' => c - b'A' + 10,
                b'_' => break,
                _ => return None,
            };
            n = n.checked_mul(36)?.checked_add(usize::from(d))?;
            self.pos += 1;
        }
        if !self.eat(b'_') {
            return None;
        }
        self.subs.get(n.checked_add(1)?).copied()
    }

    /// `T_` or `T<n>_`.
    fn template_param(&mut self) -> Option<Id> {
        self.pos += 1;
        let n = if self.eat(b'_') {
            0
        } else {
            let n = self.number()?.checked_add(1)?;
            if !self.eat(b'_') {
                return None;
            }
            n
        };
        Some(self.push(Node::Param(n)))
    }

    /// `I <template-arg>+ E`.
    fn template_args(&mut self) -> Option<Id> {
        self.enter(2)?;
        self.pos += 1;
        let mut args = Vec::new();
        while !self.eat(b'E') {
            args.push(self.template_arg()?);
        }
        if args.is_empty() {
            return None;
        }
        self.depth -= 2;
        Some(self.push(Node::Args(args)))
    }

    fn template_arg(&mut self) -> Option<Id> {
        match self.peek()? {
            b'L' => self.literal(),
            b'J' => {
                self.enter(1)?;
                self.pos += 1;
                let mut args = Vec::new();
                while !self.eat(b'E') {
                    args.push(self.template_arg()?);
                }
                self.depth -= 1;
                Some(self.push(Node::Pack(args)))
            }
            b'X' => None,
            _ => self.ty(),
        }
    }

    /// `L <type> <value> E` (not `L_Z…E`).
    fn literal(&mut self) -> Option<Id> {
        self.pos += 1;
        if self.peek() == Some(b'_') {
            return None;
        }
        let ty = self.ty()?;
        let start = self.pos;
        while self.peek()? != b'E' {
            self.pos += 1;
        }
        let end = self.pos;
        self.pos += 1;
        Some(self.push(Node::Literal(ty, start as u32, end as u32)))
    }

    /// `<type>`; every type but a builtin one becomes a substitution candidate.
    fn ty(&mut self) -> Option<Id> {
        self.enter(3)?;
        let c = self.peek()?;
        if let Some(b) = builtin(c) {
            self.pos += 1;
            self.depth -= 3;
            return Some(self.push(Node::Builtin(b)));
        }
        let id = match c {
            b'r' | b'V' | b'K' => {
                let cv = self.cv_qualifiers();
                if matches!(self.peek(), Some(b'F')) || self.peek() == Some(b'D') {
                    // Qualified function types and `Dx`/`Do` are cpp_demangle's.
                    if self.peek2() != Some(b'p') {
                        return None;
                    }
                }
                let inner = self.ty()?;
                self.push(Node::Qualified(cv, inner))
            }
            b'P' | b'R' | b'O' => {
                self.pos += 1;
                if self.peek() == Some(b'F') {
                    return None;
                }
                let inner = self.ty()?;
                self.push(match c {
                    b'P' => Node::Pointer(inner),
                    b'R' => Node::LRef(inner),
                    _ => Node::RRef(inner),
                })
            }
            b'D' if self.peek2() == Some(b'p') => {
                self.pos += 2;
                let inner = self.ty()?;
                self.push(Node::PackExpansion(inner))
            }
            b'T' => {
                let t = self.template_param()?;
                if self.peek() == Some(b'I') {
                    // A template template parameter: cpp_demangle's.
                    return None;
                }
                t
            }
            b'S' if self.peek2() != Some(b't') => {
                let s = self.substitution()?;
                if self.peek() != Some(b'I') {
                    self.depth -= 3;
                    return Some(s);
                }
                // cpp_demangle reaches these arguments through ClassEnumType and Name.
                self.enter(2)?;
                let args = self.template_args()?;
                self.depth -= 2;
                self.push(Node::UnscopedTemplate(s, args))
            }
            // Two more of cpp_demangle's levels: ClassEnumType, Name. (A type that starts
            // with `U` is a vendor type to cpp_demangle, a lambda's closure type included:
            // it gives up on those.)
            b'N' | b'Z' | b'S' | b'0'..=b'9' => {
                self.enter(2)?;
                let name = self.name()?;
                self.depth -= 2;
                name
            }
            _ => return None,
        };
        self.subs.push(id);
        self.depth -= 3;
        Some(id)
    }
}

/// One-letter builtin types (`cpp_demangle`'s spellings).
fn builtin(c: u8) -> Option<&'static str> {
    Some(match c {
        b'v' => "void",
        b'w' => "wchar_t",
        b'b' => "bool",
        b'c' => "char",
        b'a' => "signed char",
        b'h' => "unsigned char",
        b's' => "short",
        b't' => "unsigned short",
        b'i' => "int",
        b'j' => "unsigned int",
        b'l' => "long",
        b'm' => "unsigned long",
        b'x' => "long long",
        b'y' => "unsigned long long",
        b'n' => "__int128",
        b'o' => "unsigned __int128",
        b'f' => "float",
        b'd' => "double",
        b'e' => "long double",
        b'g' => "__float128",
        b'z' => "...",
        _ => return None,
    })
}

/// A suffix waiting to be printed after what comes next (`cpp_demangle`'s "inner" stack):
/// each names the node that pushed it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inner {
    /// A function's parameter list.
    Params(Id),
    Cv(Id),
    Pointer(Id),
    LRef(Id),
    RRef(Id),
}

struct Printer<'a> {
    nodes: &'a [Node],
    input: &'a str,
    out: String,
    /// Template argument lists in scope, innermost last.
    scope: Vec<Id>,
    /// Template argument lists being printed.
    printing: Vec<Id>,
    inner: Vec<Inner>,
    /// Suffixes below this index are behind a barrier: not to be printed or popped.
    floor: usize,
    lambda_arg: bool,
    /// Set once any argument pack is printed, never cleared: `cpp_demangle` then prints
    /// pack expansions without their `...`.
    pack_printed: bool,
    depth: u32,
}

impl<'a> Printer<'a> {
    fn new(nodes: &'a [Node], input: &'a str) -> Self {
        Printer {
            nodes,
            input,
            // Kernel names print about ten times longer than they are mangled.
            out: String::with_capacity(input.len() * 12),
            scope: Vec::new(),
            printing: Vec::new(),
            inner: Vec::new(),
            floor: 0,
            lambda_arg: false,
            pack_printed: false,
            depth: 0,
        }
    }

    fn get(&self, id: Id) -> Option<&'a Node> {
        self.nodes.get(id as usize)
    }

    fn last(&self) -> Option<u8> {
        self.out.as_bytes().last().copied()
    }

    fn ensure_space(&mut self) {
        if self.last() != Some(b' ') {
            self.out.push(' ');
        }
    }

    fn cv(&mut self, cv: u8) {
        for (bit, word) in [(1, "const"), (2, "volatile"), (4, "restrict")] {
            if cv & bit != 0 {
                self.ensure_space();
                self.out.push_str(word);
            }
        }
    }

    /// The template arguments a function name carries (its last component's).
    fn template_args_of(&self, name: Id) -> Option<Id> {
        match self.get(name)? {
            Node::Template(_, args) | Node::UnscopedTemplate(_, args) => Some(*args),
            Node::NestedName(inner, _) => self.template_args_of(*inner),
            Node::Local(_, entity) => self.template_args_of(*entity),
            _ => None,
        }
    }

    /// Prints `f` with the pending suffixes set aside (`cpp_demangle`'s inner barrier).
    fn barrier(&mut self, f: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
        let (floor, len) = (self.floor, self.inner.len());
        self.floor = len;
        let r = f(self);
        self.inner.truncate(len);
        self.floor = floor;
        r
    }

    /// The innermost pending suffix above the barrier.
    fn top(&self) -> Option<Inner> {
        self.inner[self.floor..].last().copied()
    }

    fn pop(&mut self) -> Option<Inner> {
        if self.inner.len() > self.floor {
            self.inner.pop()
        } else {
            None
        }
    }

    /// Prints `inner` after pushing `item`, then `item`'s suffix unless something in between
    /// printed it.
    fn around(&mut self, item: Inner, inner: Id) -> Option<()> {
        self.inner.push(item);
        self.node(inner)?;
        if self.top() == Some(item) {
            self.pop();
            self.suffix(item)?;
        }
        Some(())
    }

    /// A pending suffix, printed.
    fn suffix(&mut self, item: Inner) -> Option<()> {
        match item {
            Inner::Params(f) => self.params(f),
            Inner::Cv(q) => match self.get(q)? {
                Node::Qualified(cv, _) => {
                    self.cv(*cv);
                    Some(())
                }
                _ => None,
            },
            Inner::Pointer(_) => {
                self.out.push('*');
                Some(())
            }
            Inner::LRef(_) => {
                self.reference("&");
                Some(())
            }
            Inner::RRef(_) => {
                self.reference("&&");
                Some(())
            }
        }
    }

    /// A reference's `&` or `&&`, collapsed as cpp_demangle does: r-value references
    /// pending right below it are dropped, and an l-value one there prints instead.
    fn reference(&mut self, text: &str) {
        while let Some(top) = self.top() {
            match top {
                Inner::RRef(_) => {
                    self.pop();
                }
                Inner::LRef(_) => return,
                _ => break,
            }
        }
        self.out.push_str(text);
    }

    /// A function's parameter list, where its name is done.
    fn params(&mut self, f: Id) -> Option<()> {
        let Node::Function(name, types) = self.get(f)? else {
            return None;
        };
        let args = self.template_args_of(*name);
        let types = if args.is_some() {
            types.get(1..)?
        } else {
            &types[..]
        };
        if let Some(args) = args {
            self.scope.push(args);
        }
        // Suffixes still pending put the list in parentheses (`(*)(int)`): cpp_demangle's
        // own business, never seen in a kernel name.
        if self.inner[self.floor..].iter().any(|i| {
            matches!(
                i,
                Inner::Cv(_) | Inner::Pointer(_) | Inner::LRef(_) | Inner::RRef(_)
            )
        }) {
            return None;
        }
        self.out.push('(');
        if let [only] = types {
            if matches!(self.get(*only)?, Node::Builtin("void")) {
                self.out.push(')');
                if args.is_some() {
                    self.scope.pop();
                }
                return self.drain();
            }
        }
        for (i, t) in types.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            self.node(*t)?;
        }
        self.out.push(')');
        if args.is_some() {
            self.scope.pop();
        }
        self.drain()
    }

    /// Every suffix still pending, printed (after a parameter list).
    fn drain(&mut self) -> Option<()> {
        while let Some(item) = self.pop() {
            self.suffix(item)?;
        }
        Some(())
    }

    fn node(&mut self, id: Id) -> Option<()> {
        // At most three of cpp_demangle's print levels per node.
        self.depth += 3;
        if self.depth > PRINT_LIMIT {
            return None;
        }
        let r = self.node_inner(id);
        self.depth -= 3;
        r
    }

    fn node_inner(&mut self, id: Id) -> Option<()> {
        match self.get(id)? {
            Node::Source(start, end) => {
                // ASCII (checked when parsed): always a character boundary.
                let ident = self.input.get(*start as usize..*end as usize)?;
                let b = ident.as_bytes();
                if b.starts_with(b"_GLOBAL_")
                    && b.len() >= 10
                    && matches!(b[8], b'.' | b'_' | b'$')
                    && b[9] == b'N'
                {
                    self.out.push_str("(anonymous namespace)");
                } else {
                    self.out.push_str(ident);
                }
            }
            Node::Closure(sig, n) => {
                self.out.push_str("{lambda(");
                self.lambda_arg = true;
                for (i, t) in sig.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(", ");
                    }
                    self.node(*t)?;
                }
                self.lambda_arg = false;
                self.out.push_str(")#");
                self.out.push_str(itoa::Buffer::new().format(*n));
                self.out.push('}');
            }
            Node::Operator(s) | Node::WellKnown(s) | Node::Builtin(s) => self.out.push_str(s),
            Node::Nested(prefix, name) => {
                self.node(*prefix)?;
                self.out.push_str("::");
                self.node(*name)?;
            }
            Node::Template(name, args) => {
                self.node(*name)?;
                self.node(*args)?;
            }
            Node::UnscopedTemplate(name, args) => {
                self.scope.push(*args);
                let r = self.node(*name);
                self.scope.pop();
                r?;
                self.node(*args)?;
            }
            Node::NestedName(name, cv) => {
                self.node(*name)?;
                if let Some(item) = self.pop() {
                    self.suffix(item)?;
                }
                self.cv(*cv);
            }
            Node::Args(args) => {
                if self.printing.contains(&id) {
                    return None;
                }
                self.printing.push(id);
                self.barrier(|p| {
                    if p.last() == Some(b'<') {
                        p.out.push(' ');
                    }
                    p.out.push('<');
                    for (i, a) in args.iter().enumerate() {
                        if i > 0 {
                            p.out.push_str(", ");
                        }
                        p.node(*a)?;
                    }
                    if p.last() == Some(b'>') {
                        p.out.push(' ');
                    }
                    p.out.push('>');
                    Some(())
                })?;
                self.printing.pop();
            }
            Node::Pack(args) => {
                self.pack_printed = true;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(", ");
                    }
                    self.node(*a)?;
                }
            }
            Node::Literal(ty, start, end) => {
                let value = self.input.get(*start as usize..*end as usize)?;
                let ty_node = self.get(*ty)?;
                match (ty_node, value) {
                    (Node::Builtin("bool"), "0") => self.out.push_str("false"),
                    (Node::Builtin("bool"), "1") => self.out.push_str("true"),
                    (Node::Builtin("float" | "double"), _) => return None,
                    _ => {
                        if !matches!(ty_node, Node::Builtin("int")) {
                            self.out.push('(');
                            self.node(*ty)?;
                            self.out.push(')');
                        }
                        match value.strip_prefix('n') {
                            Some(rest) => {
                                self.out.push('-');
                                self.out.push_str(rest);
                            }
                            None => self.out.push_str(value),
                        }
                    }
                }
            }
            Node::Qualified(_, inner) => self.around(Inner::Cv(id), *inner)?,
            Node::Pointer(inner) => self.around(Inner::Pointer(id), *inner)?,
            Node::LRef(inner) => self.around(Inner::LRef(id), *inner)?,
            Node::RRef(inner) => self.around(Inner::RRef(id), *inner)?,
            Node::PackExpansion(inner) => {
                self.node(*inner)?;
                if !self.pack_printed {
                    self.out.push_str("...");
                }
            }
            Node::Param(n) => {
                if self.lambda_arg {
                    self.out.push_str("auto:");
                    self.out
                        .push_str(itoa::Buffer::new().format(u64::from(*n) + 1));
                } else {
                    let arg = self.resolve(*n)?;
                    self.node(arg)?;
                }
            }
            Node::Local(enc, entity) => {
                self.barrier(|p| p.node(*enc))?;
                self.out.push_str("::");
                self.node(*entity)?;
            }
            Node::Function(name, types) => {
                let args = self.template_args_of(*name);
                self.barrier(|p| {
                    if let Some(args) = args {
                        p.scope.push(args);
                        p.node(*types.first()?)?;
                        p.out.push(' ');
                    }
                    let item = Inner::Params(id);
                    p.inner.push(item);
                    p.node(*name)?;
                    if p.top() == Some(item) {
                        p.pop();
                        p.params(id)?;
                    }
                    if args.is_some() {
                        p.scope.pop();
                    }
                    Some(())
                })?;
            }
        }
        Some(())
    }

    /// The argument `T<n>_` names: the innermost list in scope that has one. Where that
    /// list is being printed, `cpp_demangle` may refuse a forward reference: its call.
    fn resolve(&self, n: u32) -> Option<Id> {
        for &args in self.scope.iter().rev() {
            let Some(Node::Args(list)) = self.get(args) else {
                return None;
            };
            if let Some(&arg) = list.get(n as usize) {
                if self.printing.contains(&args) {
                    return None;
                }
                return Some(arg);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast path's answer, checked against cpp_demangle's.
    fn both(name: &str) -> String {
        let mine = fast(name).unwrap_or_else(|| panic!("{name} did not take the fast path"));
        assert_eq!(Some(&mine), reference(name).as_ref(), "{name}");
        mine
    }

    #[test]
    fn plain_functions_and_templates() {
        assert_eq!(
            both("_Z6vecAddPKfS0_Pfi"),
            "vecAdd(float const*, float const*, float*, int)"
        );
        assert_eq!(both("_Z6kernelv"), "kernel()");
        assert_eq!(
            both("_ZN2at6native13reduce_kernelILi512ELi1EEEvPcS2_"),
            "void at::native::reduce_kernel<512, 1>(char*, char*)"
        );
        assert_eq!(
            both("_Z1fISt5arrayIPcLm2EEEvT_"),
            "void f<std::array<char*, (unsigned long)2> >(std::array<char*, (unsigned long)2>)"
        );
    }

    #[test]
    fn literals_lambdas_and_anonymous_namespaces() {
        assert_eq!(both("_Z1fILb1ELin1EEvv"), "void f<true, -1>()");
        assert_eq!(
            both("_Z1fILN4cute4UMMA5MajorE0EEvv"),
            "void f<(cute::UMMA::Major)0>()"
        );
        assert_eq!(
            both("_ZN12_GLOBAL__N_13fooEv"),
            "(anonymous namespace)::foo()"
        );
        assert_eq!(
            both("_Z1fIZ1gvEUlifE0_EvT_"),
            "void f<g()::{lambda(int, float)#2}>(g()::{lambda(int, float)#2})"
        );
        assert_eq!(
            both("_Z1fIZZ1gvENKUlvE_clEvEUliE_EvT_"),
            "void f<g()::{lambda()#1}::operator()() const::{lambda(int)#1}>\
             (g()::{lambda()#1}::operator()() const::{lambda(int)#1})"
        );
    }

    /// What cpp_demangle does that a reader would not expect, and the fast path copies.
    #[test]
    fn cpp_demangle_quirks() {
        // A lambda's parameters take the `const` and `&` pending from around it.
        assert_eq!(
            both("_Z1fIZ1gvEUlN1a1bES1_E_EvRKT_"),
            "void f<g()::{lambda(a::b, a::b)#1}>(g()::{lambda(a::b const, a::b&)#1})"
        );
        // Once a pack has been printed, pack expansions lose their `...`.
        assert_eq!(both("_Z1fIJiEEvDpT_"), "void f<int>(int)");
        assert_eq!(both("_Z1fIiEvDpT_"), "void f<int>(int...)");
        // `T_` inside an unscoped template's name names that template's own arguments:
        // `S2_` is `T_`, and `S2_IcE` prints as `char<char>`, not `int<char>`.
        assert_eq!(
            both("_Z1fIiEN1a1bIT_EES2_IcE"),
            "a::b<int> f<int>(char<char>)"
        );
    }

    #[test]
    fn what_cpp_demangle_refuses_the_fast_path_refuses() {
        for name in [
            "_ZZ1fvE1a__5_", // `__<n>_` discriminators start at 10
            "_Z1aSaISaISaISaISaISaISaISaISaISaISaISaISaISaISaISaISaIiEEEEEEEEEEEEEEEEE", // too deep
            "_Z1fIUliE_EvT_", // a closure type where a type is wanted
            "_ZN1aIiE",      // cut short
            "_Z1fIiEvNSaE",  // a nested name of a lone substitution
            "_Z1fv.cold",    // a clone suffix (cpp_demangle takes it; the fast path not)
            "_Z1fILi1EEvT0_", // a template parameter out of range
        ] {
            assert!(fast(name).is_none(), "{name}");
            assert_eq!(
                demangle(name),
                reference(name).unwrap_or_else(|| name.into())
            );
        }
        assert_eq!(demangle("triton_poi_fused_add_0"), "triton_poi_fused_add_0");
        // A lambda's `auto` parameter numbered at the top of the range prints as it is.
        assert_eq!(both("_ZUlT4294967294_E_v"), "{lambda(auto:4294967296)#1}()");
        assert_eq!(both("_ZZ1fvE1a__12_"), "f()::a");
    }
}
