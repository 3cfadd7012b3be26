//! jq expressions ([`Expr`], run by the jaq interpreter) and JSON templates whose strings hold `${...}` holes
//! ([`Template`]). Only computation happens here: the jq functions that would read the process environment,
//! the clock or the local time zone, write to the log or end the process are not offered.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use jaq_core::compile::Undefined;
use jaq_core::data::JustLut;
use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars};
use jaq_json::{Num, Rc, Val};
use serde_json::Value;

type Data = JustLut<Val>;
type Filter = jaq_core::Filter<Data>;

/// jq functions left out: `env` reads the process environment (and with it secrets), `halt` and `halt_error`
/// end the program, `now`, `localtime` and `strflocaltime` read the clock or the machine's time zone, `debug`
/// and `stderr` (and their natives `debug_empty` and `stderr_empty`) write to the log. Both the native
/// functions and the jq definitions of these names are left out, so calling one is a compile error that names it.
const DENIED: &[&str] = &[
    "env",
    "halt",
    "halt_error",
    "now",
    "localtime",
    "strflocaltime",
    "debug",
    "stderr",
    "debug_empty",
    "stderr_empty",
];

/// Error messages are cut to this many characters: a runtime error may quote a large value.
const MAX_ERROR_CHARS: usize = 400;

/// Why an expression or a template gave no value, typed by whose the fault is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExprError {
    /// The source is not an expression this platform runs: what is wrong and where.
    Compile(String),
    /// The expression raised an error on its input (`error(...)`, a type error, a missing key).
    Raised(String),
    /// The expression was stopped before it answered: a time or memory limit of the sandbox, or
    /// the interpreter failing on it.
    Stopped(String),
    /// A template names a credential its renderer does not give.
    Credential(String),
}

impl ExprError {
    /// The message, as fires, answers and logs carry it.
    pub fn message(&self) -> &str {
        match self {
            ExprError::Compile(m) | ExprError::Raised(m) | ExprError::Stopped(m) | ExprError::Credential(m) => m,
        }
    }

    /// The same error with `context` (where it happened) before its message.
    pub fn within(self, context: impl fmt::Display) -> ExprError {
        let with = |m: String| format!("{context}: {m}");
        match self {
            ExprError::Compile(m) => ExprError::Compile(with(m)),
            ExprError::Raised(m) => ExprError::Raised(with(m)),
            ExprError::Stopped(m) => ExprError::Stopped(with(m)),
            ExprError::Credential(m) => ExprError::Credential(with(m)),
        }
    }

    /// The kind's name, as a sandbox worker reports it: `compile`, `raised`, `stopped` or `credential`.
    pub fn kind(&self) -> &'static str {
        match self {
            ExprError::Compile(_) => "compile",
            ExprError::Raised(_) => "raised",
            ExprError::Stopped(_) => "stopped",
            ExprError::Credential(_) => "credential",
        }
    }

    /// The error of kind `kind` (see [`ExprError::kind`]; an unknown kind reads as raised).
    pub fn of_kind(kind: &str, message: String) -> ExprError {
        match kind {
            "compile" => ExprError::Compile(message),
            "stopped" => ExprError::Stopped(message),
            "credential" => ExprError::Credential(message),
            _ => ExprError::Raised(message),
        }
    }
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ExprError {}

/// Runs a jq program (its source) on an input elsewhere and answers its first output.
pub type Sandbox = Arc<dyn Fn(&str, &Value) -> Result<Option<Value>, ExprError> + Send + Sync>;

/// Where expressions run: every evaluation names one. On a master it is a sandbox (worker
/// processes with time and memory limits), given by whoever starts the master: a jq program can
/// recurse without end or build a value deep enough to overflow the stack, which no code can
/// catch in process. In process is for tools and tests that evaluate trusted expressions.
#[derive(Clone, Default)]
pub struct Runner {
    sandbox: Option<Sandbox>,
}

impl Runner {
    /// Evaluates in this process.
    pub fn in_process() -> Runner {
        Runner { sandbox: None }
    }
    /// Evaluates through `sandbox`.
    pub fn sandboxed(sandbox: Sandbox) -> Runner {
        Runner { sandbox: Some(sandbox) }
    }
    pub fn is_sandboxed(&self) -> bool {
        self.sandbox.is_some()
    }
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_sandboxed() { "Runner(sandboxed)" } else { "Runner(in process)" })
    }
}

/// A compiled jq expression. Cloning is cheap (the compiled filter is shared).
#[derive(Clone)]
pub struct Expr {
    source: Arc<str>,
    filter: Arc<Filter>,
    /// A plain path (`.a.b[0]`): it only looks a value up in its input, so it cannot recurse or
    /// grow anything, and it runs in this process even for a sandboxed runner, without the
    /// round trip to a worker.
    path_only: bool,
}

/// Longest expression accepted, in bytes.
pub const MAX_EXPR_BYTES: usize = 16 * 1024;

/// The stack the compiler runs on. jaq's parser and compiler recurse for each level of nesting
/// (about 2 KB a level in a release build), so a thousand nested parentheses overflow the 2 MiB
/// stack of a runtime thread, which aborts the process. On this stack (reserved, committed only
/// as used) the longest expression accepted compiles whatever its shape.
const COMPILE_STACK_BYTES: usize = 256 << 20;

impl Expr {
    /// Compiles `src`. The error says what is wrong and where (a byte offset into `src`).
    pub fn compile(src: &str) -> Result<Expr, ExprError> {
        if src.len() > MAX_EXPR_BYTES {
            let why = format!("the expression is {} bytes long; at most {MAX_EXPR_BYTES} are accepted", src.len());
            return Err(ExprError::Compile(why));
        }
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("jq-compile".into())
                .stack_size(COMPILE_STACK_BYTES)
                .spawn_scoped(s, || Self::compile_here(src))
                .map_err(|e| ExprError::Stopped(format!("cannot start the expression compiler: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(ExprError::Stopped("the jq compiler failed on this expression".to_string())))
        })
    }

    fn compile_here(src: &str) -> Result<Expr, ExprError> {
        let arena = Arena::default();
        let defs = jaq_core::defs().chain(jaq_std::defs()).chain(jaq_json::defs());
        let defs = defs.filter(|def| !DENIED.contains(&def.name));
        let loader = Loader::new(defs);
        let modules = loader.load(&arena, File { code: src, path: () }).map_err(|errs| {
            let msgs = errs.into_iter().flat_map(|(file, err)| load_error_messages(file.code, err));
            ExprError::Compile(join_errors(msgs))
        })?;
        let filter = Compiler::<_, Data>::default().with_funs(native_funs()).compile(modules).map_err(|errs| {
            ExprError::Compile(join_errors(errs.into_iter().flat_map(|(_, errs)| errs).map(undefined_message)))
        })?;
        Ok(Expr { source: src.into(), filter: Arc::new(filter), path_only: is_plain_path(src) })
    }

    /// The source text the expression was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// First output of the expression on `input`; `Ok(None)` when it yields nothing; `Err` on a runtime error.
    pub fn eval(&self, runner: &Runner, input: &Value) -> Result<Option<Value>, ExprError> {
        self.first(runner, to_val(input), |v| v.map(from_val))
    }

    /// The first output on `input`, always in this process: what a sandbox worker runs.
    pub fn eval_here(&self, input: &Value) -> Result<Option<Value>, ExprError> {
        self.first_here(to_val(input), |v| v.map(from_val))
    }

    /// jq truthiness of the first output: `false` and `null` are false, and so is no output.
    pub fn truthy(&self, runner: &Runner, input: &Value) -> Result<bool, ExprError> {
        self.first(runner, to_val(input), |v| matches!(v, Some(v) if !matches!(v, Val::Null | Val::Bool(false))))
    }

    /// Runs the expression on `input` and maps its first output with `f`. A panic inside the interpreter
    /// becomes an error rather than unwinding into the caller.
    fn first<T>(&self, runner: &Runner, input: Val, f: impl FnOnce(Option<&Val>) -> T) -> Result<T, ExprError> {
        match &runner.sandbox {
            Some(sandbox) if !self.path_only => {
                let out = sandbox(&self.source, &from_val(&input))?;
                Ok(f(out.map(|v| to_val(&v)).as_ref()))
            }
            _ => self.first_here(input, f),
        }
    }

    /// Whether the expression is a plain path that runs in this process whatever the runner.
    pub fn is_path_only(&self) -> bool {
        self.path_only
    }

    fn first_here<T>(&self, input: Val, f: impl FnOnce(Option<&Val>) -> T) -> Result<T, ExprError> {
        let run = || {
            let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([]));
            let mut outputs = self.filter.id.run((ctx, input));
            match outputs.next().transpose() {
                Ok(v) => Ok(f(v.as_ref())),
                Err(exn) => Err(match exn.get_err() {
                    // `error("text")` reads as the text, as in jq; other values as JSON.
                    Ok(err) => ExprError::Raised(truncate(match err.into_val() {
                        Val::TStr(b) | Val::BStr(b) => String::from_utf8_lossy(&b).into_owned(),
                        other => other.to_string(),
                    })),
                    // Only `halt` raises anything else, and it is not offered.
                    Err(_) => ExprError::Stopped("the expression stopped the program".to_string()),
                }),
            }
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
            .unwrap_or_else(|_| Err(ExprError::Stopped("the jq interpreter failed on this input".to_string())))
    }
}

/// Most steps of a path run in process: the interpreter recurses once per step, and a
/// path thousands of steps long overflows a runtime thread's stack. Longer ones go to a worker.
const PLAIN_PATH_STEPS: usize = 32;

/// Whether `src` is `.` or a chain of at most [`PLAIN_PATH_STEPS`] field names and array
/// indexes: `.a`, `.a.b_2`, `.a[0]`, `.[3].x`. Quoted names, slices, negative indexes, `?`,
/// spaces and everything else are not.
fn is_plain_path(src: &str) -> bool {
    let b = src.as_bytes();
    if b == b"." {
        return true;
    }
    let mut i = 0;
    let mut steps = 0;
    while i < b.len() {
        let start = i;
        if b[i] == b'.' && b.get(i + 1).is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') {
            i += 1;
            while b.get(i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') {
                i += 1;
            }
        } else {
            // `.[n]` at the start, `[n]` after a step.
            if b[i] == b'.' && steps == 0 {
                i += 1;
            }
            if b.get(i) != Some(&b'[') || (steps == 0 && i == start) {
                return false;
            }
            i += 1;
            let digits = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == digits || i - digits > 9 || b.get(i) != Some(&b']') {
                return false;
            }
            i += 1;
        }
        steps += 1;
        if steps > PLAIN_PATH_STEPS {
            return false;
        }
    }
    steps > 0
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Expr").field(&self.source).finish()
    }
}

impl PartialEq for Expr {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Expr {}

/// jaq's native core, standard library and JSON functions, less [`DENIED`].
fn native_funs() -> impl Iterator<Item = jaq_core::native::Fun<Data>> {
    let funs = jaq_core::funs().chain(jaq_std::funs()).chain(jaq_json::funs());
    funs.filter(|(name, _, _)| !DENIED.contains(name))
}

fn load_error_messages(code: &str, err: jaq_core::load::Error<&str>) -> Vec<String> {
    use jaq_core::load::Error;
    match err {
        Error::Io(errs) => errs.into_iter().map(|(path, e)| format!("cannot load module `{path}`: {e}")).collect(),
        Error::Lex(errs) => {
            errs.into_iter().map(|(expected, found)| expected_message(code, expected.as_str(), found)).collect()
        }
        Error::Parse(errs) => {
            errs.into_iter().map(|(expected, found)| expected_message(code, expected.as_str(), found)).collect()
        }
    }
}

fn expected_message(code: &str, expected: &str, found: &str) -> String {
    let at = offset_in(code, found).map(|o| format!(" at offset {o}")).unwrap_or_default();
    let found = if found.is_empty() {
        "end of input".to_string()
    } else {
        let shown: String = found.chars().take(20).collect();
        let more = if shown.len() < found.len() { "…" } else { "" };
        format!("`{shown}{more}`")
    };
    format!("expected {expected}, found {found}{at}")
}

/// Byte offset of `part` inside `whole`, when `part` is a slice of `whole`.
fn offset_in(whole: &str, part: &str) -> Option<usize> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    (start + part.len() <= whole.len()).then_some(start)
}

fn undefined_message((name, undefined): (&str, Undefined)) -> String {
    match undefined {
        Undefined::Filter(_) if DENIED.contains(&name) => format!("`{name}` is not available in agentos expressions"),
        Undefined::Filter(arity) => format!("undefined filter `{name}/{arity}`"),
        Undefined::Var if name.trim_start_matches('$') == "ENV" => {
            "`$ENV` is not available in agentos expressions".to_string()
        }
        other => format!("undefined {} `{name}`", other.as_str()),
    }
}

fn join_errors(msgs: impl Iterator<Item = String>) -> String {
    let msgs: Vec<String> = msgs.collect();
    if msgs.is_empty() { "invalid jq expression".to_string() } else { truncate(msgs.join("; ")) }
}

fn truncate(mut s: String) -> String {
    if let Some((cut, _)) = s.char_indices().nth(MAX_ERROR_CHARS) {
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn to_val(v: &Value) -> Val {
    match v {
        Value::Null => Val::Null,
        Value::Bool(b) => Val::Bool(*b),
        Value::Number(n) => Val::Num(if let Some(i) = n.as_i64() {
            Num::from_integral(i)
        } else if let Some(u) = n.as_u64() {
            Num::from_integral(u)
        } else {
            // Kept as its decimal text (as jaq reads JSON), so that passing it through keeps its spelling.
            Num::Dec(Rc::new(n.to_string()))
        }),
        Value::String(s) => Val::utf8_str(s.clone().into_bytes()),
        Value::Array(a) => a.iter().map(to_val).collect(),
        Value::Object(o) => {
            Val::obj(o.iter().map(|(k, v)| (Val::utf8_str(k.clone().into_bytes()), to_val(v))).collect())
        }
    }
}

fn from_val(v: &Val) -> Value {
    match v {
        Val::Null => Value::Null,
        Val::Bool(b) => Value::Bool(*b),
        Val::Num(n) => from_num(n),
        Val::TStr(b) | Val::BStr(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        Val::Arr(a) => Value::Array(a.iter().map(from_val).collect()),
        Val::Obj(o) => Value::Object(o.iter().map(|(k, v)| (key_text(k), from_val(v))).collect()),
    }
}

/// jq object keys are strings; jaq also allows other values, which become their compact JSON text.
fn key_text(k: &Val) -> String {
    match k {
        Val::TStr(b) | Val::BStr(b) => String::from_utf8_lossy(b).into_owned(),
        other => from_val(other).to_string(),
    }
}

fn from_num(n: &Num) -> Value {
    match n {
        Num::Int(i) => Value::from(*i),
        Num::Float(f) => from_f64(*f),
        // Big integers and decimal text (from the input or from a literal in the expression) that do not fit
        // serde_json's numbers (e.g. `1e1000`) become floats, as in jq.
        Num::BigInt(_) | Num::Dec(_) => {
            let text = n.to_string();
            match text.parse::<serde_json::Number>() {
                Ok(n) => Value::Number(n),
                Err(_) => from_f64(text.parse().unwrap_or(f64::NAN)),
            }
        }
    }
}

/// A computed float as jq prints it: whole numbers without a fraction, NaN as null, infinities as the largest
/// finite floats.
fn from_f64(f: f64) -> Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every whole float below is an exact i64
    if f.is_nan() {
        Value::Null
    } else if f.fract() == 0.0 && f.abs() < EXACT {
        Value::from(f as i64)
    } else {
        serde_json::Number::from_f64(f.clamp(f64::MIN, f64::MAX)).map_or(Value::Null, Value::Number)
    }
}

/// A JSON value whose strings may hold `${expr}` holes (jq expressions, or `${credentials.NAME}` references
/// resolved by the caller). `$${` is a literal `${`. Object keys are not templated.
#[derive(Clone, Debug)]
pub struct Template {
    node: Node,
    credentials: Vec<String>,
    /// Whether some hole is a jq expression.
    has_exprs: bool,
    /// Whether every expression hole is a plain path: rendering runs in this process, whatever
    /// the runner.
    paths_only: bool,
}

#[derive(Clone, Debug)]
enum Node {
    /// A part without holes, rendered as is.
    Literal(Value),
    /// A string that is exactly one hole: the hole's value, of any type.
    Whole(Hole),
    /// A string with holes inside text.
    Interpolated(Vec<Part>),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

#[derive(Clone, Debug)]
enum Part {
    Text(String),
    Hole(Hole),
}

#[derive(Clone, Debug)]
struct Hole {
    /// JSON pointer of the string holding the hole, for render errors.
    path: Arc<str>,
    kind: HoleKind,
}

#[derive(Clone, Debug)]
enum HoleKind {
    Expr(Expr),
    Credential(String),
}

const CREDENTIALS_PREFIX: &str = "credentials.";

impl Template {
    /// Compiles every hole of `value`. An error is the JSON pointer of the bad string inside `value`
    /// (e.g. `/body/summary`; `""` for `value` itself) and the reason.
    pub fn compile(value: &Value) -> Result<Template, (String, ExprError)> {
        let mut path = String::new();
        let mut holes = Holes::default();
        let node = compile_node(value, &mut path, &mut holes)?;
        Ok(Template {
            node,
            credentials: holes.credentials.into_iter().collect(),
            has_exprs: holes.exprs > 0,
            paths_only: holes.computed == 0,
        })
    }

    /// Renders the template with `input` as the jq input of every hole; `credential(name)` resolves
    /// `${credentials.NAME}`. A string that is exactly one hole becomes the hole's value (null when it yields
    /// nothing); holes inside longer strings are interpolated (strings as they are, other values as compact
    /// JSON, nothing as ""). Errors never contain a credential's value.
    pub fn render(
        &self,
        runner: &Runner,
        input: &Value,
        credential: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Value, ExprError> {
        // The input is converted for jaq once, and only when a hole needs it.
        let input = if self.has_exprs { to_val(input) } else { Val::Null };
        render_node(runner, &self.node, &input, credential)
    }

    /// Whether every expression hole is a plain path (`${.a.b}`), so rendering never leaves this
    /// process.
    pub fn paths_only(&self) -> bool {
        self.paths_only
    }

    /// Names of the credentials the template refers to, sorted, without duplicates.
    pub fn credentials(&self) -> Vec<String> {
        self.credentials.clone()
    }
}

/// What the holes of a template refer to.
#[derive(Default)]
struct Holes {
    credentials: BTreeSet<String>,
    exprs: usize,
    /// Expression holes that are not plain paths.
    computed: usize,
}

fn compile_node(value: &Value, path: &mut String, holes: &mut Holes) -> Result<Node, (String, ExprError)> {
    let node = match value {
        Value::String(s) => {
            let mut parts = parse_string(s, path).map_err(|reason| (path.clone(), reason))?;
            for part in &parts {
                match part {
                    Part::Hole(Hole { kind: HoleKind::Credential(name), .. }) => {
                        holes.credentials.insert(name.clone());
                    }
                    Part::Hole(Hole { kind: HoleKind::Expr(e), .. }) => {
                        holes.exprs += 1;
                        holes.computed += usize::from(!e.is_path_only());
                    }
                    Part::Text(_) => {}
                }
            }
            match parts.len() {
                0 => Node::Literal(Value::String(String::new())),
                1 => match parts.pop() {
                    Some(Part::Hole(hole)) => Node::Whole(hole),
                    Some(Part::Text(text)) => Node::Literal(Value::String(text)),
                    None => Node::Literal(Value::String(String::new())),
                },
                _ => Node::Interpolated(parts),
            }
        }
        Value::Array(items) => {
            let mut nodes = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                nodes.push(compile_node(item, path, holes)?);
                path.truncate(len);
            }
            match literals(nodes.iter()) {
                Some(values) => Node::Literal(Value::Array(values)),
                None => Node::Array(nodes),
            }
        }
        Value::Object(fields) => {
            let mut nodes = Vec::with_capacity(fields.len());
            for (key, item) in fields {
                let len = path.len();
                path.push('/');
                path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                nodes.push((key.clone(), compile_node(item, path, holes)?));
                path.truncate(len);
            }
            match literals(nodes.iter().map(|(_, n)| n)) {
                Some(values) => {
                    Node::Literal(Value::Object(nodes.iter().map(|(k, _)| k.clone()).zip(values).collect()))
                }
                None => Node::Object(nodes),
            }
        }
        other => Node::Literal(other.clone()),
    };
    Ok(node)
}

/// The values of `nodes` when all of them are literals.
fn literals<'a>(nodes: impl Iterator<Item = &'a Node>) -> Option<Vec<Value>> {
    nodes
        .map(|n| match n {
            Node::Literal(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

/// Splits a template string into text and holes.
fn parse_string(s: &str, path: &str) -> Result<Vec<Part>, ExprError> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while let Some(found) = s[i..].find('$') {
        let at = i + found;
        text.push_str(&s[i..at]);
        let rest = &s[at..];
        if rest.starts_with("$${") {
            text.push_str("${");
            i = at + 3;
        } else if rest.starts_with("${") {
            let start = at + 2;
            let len = hole_len(&s[start..]).map_err(|e| ExprError::Compile(format!("hole at offset {at}: {e}")))?;
            let src = &s[start..start + len];
            let kind = parse_hole(src).map_err(|e| e.within(format_args!("hole `${{{}}}`", shorten(src))))?;
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            parts.push(Part::Hole(Hole { path: path.into(), kind }));
            i = start + len + 1;
        } else {
            text.push('$');
            i = at + 1;
        }
    }
    text.push_str(&s[i..]);
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

/// Length of the jq source of a hole, `body` being the text after its `${`: the hole ends at the first `}`
/// that closes no `{` of its own, braces inside jq string literals (outside their `\(...)`) not counting.
fn hole_len(body: &str) -> Result<usize, String> {
    // Open delimiters: '{' and '(' in code, '"' for a string literal; a '(' above a '"' is an interpolation.
    let mut open: Vec<char> = Vec::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        if open.last() == Some(&'"') {
            match c {
                '\\' => {
                    if let Some((_, '(')) = chars.next() {
                        open.push('(');
                    }
                }
                '"' => {
                    open.pop();
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' | '{' | '(' => open.push(c),
            ')' if open.last() == Some(&'(') => {
                open.pop();
            }
            '}' => match open.last() {
                None => return Ok(i),
                Some('{') => {
                    open.pop();
                }
                Some(_) => return Err("`}` closes an open `(`".to_string()),
            },
            _ => {}
        }
    }
    Err(match open.last() {
        Some('"') => "unterminated string literal in `${`".to_string(),
        _ => "`${` without its closing `}`".to_string(),
    })
}

fn parse_hole(src: &str) -> Result<HoleKind, ExprError> {
    let trimmed = src.trim();
    if trimmed.is_empty() {
        return Err(ExprError::Compile("empty hole".to_string()));
    }
    if let Some(name) = trimmed.strip_prefix(CREDENTIALS_PREFIX) {
        let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            let why = "a credential reference is `credentials.NAME`, NAME made of A-Z a-z 0-9 _ -";
            return Err(ExprError::Compile(why.to_string()));
        }
        return Ok(HoleKind::Credential(name.to_string()));
    }
    Expr::compile(src).map(HoleKind::Expr)
}

fn shorten(src: &str) -> String {
    const MAX: usize = 60;
    match src.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &src[..cut]),
        None => src.to_string(),
    }
}

fn render_node(
    runner: &Runner,
    node: &Node,
    input: &Val,
    credential: &dyn Fn(&str) -> Option<String>,
) -> Result<Value, ExprError> {
    Ok(match node {
        Node::Literal(v) => v.clone(),
        Node::Whole(hole) => match &hole.kind {
            HoleKind::Expr(expr) => eval_hole(runner, hole, expr, input)?.unwrap_or(Value::Null),
            HoleKind::Credential(name) => Value::String(resolve(hole, name, credential)?),
        },
        Node::Interpolated(parts) => {
            let mut out = String::new();
            for part in parts {
                match part {
                    Part::Text(text) => out.push_str(text),
                    Part::Hole(hole) => match &hole.kind {
                        HoleKind::Expr(expr) => match eval_hole(runner, hole, expr, input)? {
                            None => {}
                            Some(Value::String(s)) => out.push_str(&s),
                            Some(other) => out.push_str(&other.to_string()),
                        },
                        HoleKind::Credential(name) => out.push_str(&resolve(hole, name, credential)?),
                    },
                }
            }
            Value::String(out)
        }
        Node::Array(items) => {
            Value::Array(items.iter().map(|n| render_node(runner, n, input, credential)).collect::<Result<_, _>>()?)
        }
        Node::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, n)| Ok((k.clone(), render_node(runner, n, input, credential)?)))
                .collect::<Result<_, ExprError>>()?,
        ),
    })
}

fn eval_hole(runner: &Runner, hole: &Hole, expr: &Expr, input: &Val) -> Result<Option<Value>, ExprError> {
    expr.first(runner, input.clone(), |v| v.map(from_val))
        .map_err(|e| e.within(format_args!("{}: hole `${{{}}}`", display_path(&hole.path), shorten(expr.source()))))
}

fn resolve(hole: &Hole, name: &str, credential: &dyn Fn(&str) -> Option<String>) -> Result<String, ExprError> {
    credential(name)
        .ok_or_else(|| ExprError::Credential(format!("{}: unknown credential `{name}`", display_path(&hole.path))))
}

fn display_path(path: &str) -> &str {
    if path.is_empty() { "(top)" } else { path }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[track_caller]
    fn check<T: PartialEq + fmt::Debug>(case: &str, got: T, want: T) {
        assert_eq!(got, want, "case: {case}");
    }

    /// The value, or `Err(())` for any error.
    fn outcome<T, E>(r: Result<T, E>) -> Result<T, ()> {
        r.map_err(|_| ())
    }

    #[test]
    fn the_deepest_nesting_accepted_compiles_on_a_small_stack_and_longer_is_refused() {
        // A runtime thread's stack: compiling here must not depend on it.
        let small = std::thread::Builder::new().stack_size(2 << 20);
        let shapes = small
            .spawn(|| {
                let half = (MAX_EXPR_BYTES - 1) / 2;
                let parens = format!("{}.{}", "(".repeat(half), ")".repeat(half));
                let arrays = format!("{}1{}", "[".repeat(half), "]".repeat(half));
                let pipes = vec!["."; MAX_EXPR_BYTES / 2].join("|");
                let sums = vec!["1"; MAX_EXPR_BYTES / 2].join("+");
                [parens, arrays, pipes, sums].map(|src| (src.len(), Expr::compile(&src).map(|_| ())))
            })
            .unwrap()
            .join()
            .unwrap();
        for (len, r) in shapes {
            assert!(len <= MAX_EXPR_BYTES);
            assert!(r.is_ok(), "{len} bytes: {r:?}");
        }
        let err = Expr::compile(&".".repeat(MAX_EXPR_BYTES + 1)).unwrap_err();
        assert!(matches!(err, ExprError::Compile(_)), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("at most 16384"), "{err}");
    }

    #[test]
    fn a_plain_path_runs_in_process_and_anything_else_goes_to_the_sandbox() {
        let asked = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = asked.clone();
        let runner = Runner::sandboxed(Arc::new(move |src: &str, input: &Value| {
            seen.lock().unwrap().push(src.to_string());
            Expr::compile(src)?.eval_here(input)
        }));
        let input = json!({"a": {"b": [10, {"c_1": "x"}]}, "n": 2, "s": "text"});
        let plain = [".", ".a", ".a.b", ".a.b[1].c_1", ".[0]", ".a.b[7]", ".missing.deeper", ".s.x", ".a[0]", ".n[1]"];
        let not_plain = [
            "..",
            ".a | .b",
            ".a.b[-1]",
            ".a.b[0:1]",
            ".a?",
            ".\"a\"",
            ".a .b",
            "[0]",
            ".a.[0]",
            ".a.b[1]?",
            ".a[]",
            ".a[1234567890]",
            "1",
            "$__loc__",
            "length",
            ".a + 1",
        ];
        // Too long to run on a runtime thread's stack: it goes to a worker like any program.
        let long = ".a".repeat(PLAIN_PATH_STEPS + 1);
        let not_plain: Vec<&str> = not_plain.into_iter().chain([long.as_str()]).collect();
        assert!(Expr::compile(&".a".repeat(PLAIN_PATH_STEPS)).unwrap().is_path_only());
        for src in plain {
            let e = Expr::compile(src).unwrap();
            assert!(e.is_path_only(), "{src}");
            // The same answer, error or value, as the interpreter gives it in process.
            check(src, e.eval(&runner, &input), e.eval_here(&input));
        }
        assert!(asked.lock().unwrap().is_empty(), "a plain path reached the sandbox: {:?}", asked.lock().unwrap());
        for src in not_plain {
            let Ok(e) = Expr::compile(src) else { continue };
            assert!(!e.is_path_only(), "{src}");
            let _ = e.eval(&runner, &input);
            assert_eq!(asked.lock().unwrap().pop().as_deref(), Some(src), "{src} did not go to the sandbox");
        }
        // A template's plain hole runs in process too; one that computes goes to the sandbox.
        let plain =
            Template::compile(&json!({"x": "${.a.b[0]}", "y": "n=${.n}", "z": [1, "${credentials.K}"]})).unwrap();
        assert!(plain.paths_only());
        let t = Template::compile(&json!({"x": "${.a.b[0]}", "y": "${.n + 1}"})).unwrap();
        assert!(!t.paths_only());
        check("template", t.render(&runner, &input, &|_| None), Ok(json!({"x": 10, "y": 3})));
        assert_eq!(*asked.lock().unwrap(), vec![".n + 1".to_string()]);
    }

    #[test]
    fn expr_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync + Clone>() {}
        assert_send_sync::<Expr>();
        assert_send_sync::<Template>();
    }

    #[test]
    fn compile_errors_say_what_is_wrong() {
        let cases = [
            (".a +", "expected term, found end of input"),
            ("[1, 2", "closing bracket"),
            ("", "expected term"),
            ("foo", "undefined filter `foo/0`"),
            ("map", "undefined filter `map/0`"),
            ("$x", "undefined variable"),
            ("if . then 1", "else or end"),
            ("env", "`env` is not available"),
            ("now", "`now` is not available"),
            ("halt", "`halt` is not available"),
            ("halt_error(1)", "`halt_error` is not available"),
            ("$ENV.HOME", "`$ENV` is not available"),
            ("import \"x\" as x; .", "cannot load module"),
        ];
        for (src, want) in cases {
            let err = Expr::compile(src).expect_err(src);
            assert!(matches!(err, ExprError::Compile(_)), "{err:?}");
            let err = err.to_string();
            check(&format!("{src:?} -> {err}"), err.contains(want), true);
        }
        // Functions from the standard library that only compute are there.
        for src in [".", "map(. + 1)", "[.[] | select(. > 1)] | length", "test(\"a+\")", "@base64", "todate", "tojson"]
        {
            check(src, Expr::compile(src).map(|e| e.source().to_string()), Ok(src.to_string()));
        }
    }

    #[test]
    fn eval_first_output() {
        let input = json!({"a": {"b": [1, 2, 3]}, "n": 2, "f": 1.5, "one": 1.0, "big": u64::MAX, "s": "x", "t": true});
        let cases = [
            (".a.b[1]", Ok(Some(json!(2)))),
            (".n * 3 + 1", Ok(Some(json!(7)))),
            (".n / 4", Ok(Some(json!(0.5)))),
            ("10 / .n", Ok(Some(json!(5)))),
            (".f", Ok(Some(json!(1.5)))),
            (".f + 1", Ok(Some(json!(2.5)))),
            ("1e1000", Ok(Some(json!(f64::MAX)))),
            (".missing", Ok(Some(Value::Null))),
            (".missing.deeper", Ok(Some(Value::Null))),
            (".missing[0]", Ok(Some(Value::Null))),
            (".one", Ok(Some(json!(1.0)))),
            (".big", Ok(Some(json!(u64::MAX)))),
            ("[.a.b[] * 2]", Ok(Some(json!([2, 4, 6])))),
            ("\"2020-01-01T00:00:00Z\" | fromdate", Ok(Some(json!(1577836800)))),
            (".a.b[] | select(. > 1)", Ok(Some(json!(2)))),
            (".a.b[] | select(. > 5)", Ok(None)),
            ("empty", Ok(None)),
            ("{x: .s, y: [.t, null]}", Ok(Some(json!({"x": "x", "y": [true, null]})))),
            ("\"\\(.s)-\\(.n)\"", Ok(Some(json!("x-2")))),
            (".s + 1", Err(())),
            ("error(\"boom\")", Err(())),
            (".a.b.c", Err(())),
            ("error({code: 1})", Err(())),
        ];
        for (src, want) in cases {
            let expr = Expr::compile(src).unwrap();
            check(src, outcome(expr.eval(&Runner::in_process(), &input)), want);
        }
        for (src, want) in [("error(\"boom\")", "boom"), ("error({code: 1})", "{\"code\":1}"), (".s + 1", "cannot")] {
            let err = Expr::compile(src).unwrap().eval(&Runner::in_process(), &input).unwrap_err();
            assert!(matches!(err, ExprError::Raised(_)), "{err:?}");
            let err = err.to_string();
            check(&format!("{src} -> {err}"), err.starts_with(want), true);
        }
    }

    #[test]
    fn truthy_is_jq_truthiness_of_the_first_output() {
        let input = json!({"n": 0, "s": "", "a": [], "f": false, "o": {"k": 1}});
        let cases = [
            (".n", Ok(true)),
            (".s", Ok(true)),
            (".a", Ok(true)),
            (".f", Ok(false)),
            (".missing", Ok(false)),
            ("empty", Ok(false)),
            (".o.k == 1", Ok(true)),
            (".o.k > 1", Ok(false)),
            ("false, true", Ok(false)),
            ("select(.n == 1)", Ok(false)),
            (".o | has(\"k\")", Ok(true)),
            (".s.x", Err(())),
        ];
        for (src, want) in cases {
            check(src, outcome(Expr::compile(src).unwrap().truthy(&Runner::in_process(), &input)), want);
        }
    }

    fn no_credentials(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn templates_render() {
        let input = json!({
            "input": {"data": {"title": "Hi", "count": 2, "tags": ["a", "b"], "meta": {"k": 1}}},
            "name": "Ada",
            "amp": "{}",
        });
        let cases = [
            (json!("${.input.data.title}"), json!("Hi")),
            (json!("${.input.data.count + 1}"), json!(3)),
            (json!("${.input.data.tags}"), json!(["a", "b"])),
            (json!("${.input.data.meta}"), json!({"k": 1})),
            (json!("${ .input.data.count > 1 }"), json!(true)),
            (json!("${.missing}"), Value::Null),
            (json!("${empty}"), Value::Null),
            (json!("Hello ${.name}!"), json!("Hello Ada!")),
            (
                json!("n=${.input.data.count}, tags=${.input.data.tags}, m=${.input.data.meta}"),
                json!("n=2, tags=[\"a\",\"b\"], m={\"k\":1}"),
            ),
            (json!("[${empty}]"), json!("[]")),
            (json!("[${.missing}]"), json!("[null]")),
            (json!("$${.name}"), json!("${.name}")),
            (json!("cost: $5, $${x} and ${.name}"), json!("cost: $5, ${x} and Ada")),
            (json!("$$${.name}"), json!("$${.name}")),
            (json!("$"), json!("$")),
            (json!("${ {a: .name} }"), json!({"a": "Ada"})),
            (json!("${ {a: {b: .name}} | .a.b }"), json!("Ada")),
            (json!("${ \"}\" + .name }"), json!("}Ada")),
            (json!("${ \"\\\"}\" }"), json!("\"}")),
            (json!("${ \"a\\({x: 1}.x)}\" }"), json!("a1}")),
            (json!("${.amp}"), json!("{}")),
            (json!({"${.name}": "${.name}"}), json!({"${.name}": "Ada"})),
            (
                json!({"body": {"summary": "${.input.data.title}", "list": [1, "${.name}", {"n": "${.input.data.count}"}]}, "x": 1}),
                json!({"body": {"summary": "Hi", "list": [1, "Ada", {"n": 2}]}, "x": 1}),
            ),
            (json!({"plain": [1, "two", {"three": null}]}), json!({"plain": [1, "two", {"three": null}]})),
        ];
        for (template, want) in cases {
            let case = template.to_string();
            let t = Template::compile(&template).unwrap_or_else(|e| panic!("{case}: {e:?}"));
            check(&case, t.render(&Runner::in_process(), &input, &no_credentials), Ok(want));
            check(&case, t.credentials(), Vec::<String>::new());
        }
    }

    #[test]
    fn template_credentials() {
        let template = json!({
            "summary": "${.input.data.title}",
            "n": "${.input.data.count + 1}",
            "text": "Hello ${.name}!",
            "auth": "Bearer ${credentials.API_KEY}",
            "headers": [{"x-token": "${ credentials.other-token }"}, "${credentials.API_KEY}"],
        });
        let t = Template::compile(&template).unwrap();
        check("listed", t.credentials(), vec!["API_KEY".to_string(), "other-token".to_string()]);
        let input = json!({"input": {"data": {"title": "T", "count": 1}}, "name": "Bo"});
        let vault = |name: &str| match name {
            "API_KEY" => Some("s3cret".to_string()),
            "other-token" => Some("tok".to_string()),
            _ => None,
        };
        let want = json!({
            "summary": "T",
            "n": 2,
            "text": "Hello Bo!",
            "auth": "Bearer s3cret",
            "headers": [{"x-token": "tok"}, "s3cret"],
        });
        check("rendered", t.render(&Runner::in_process(), &input, &vault), Ok(want));

        // Unknown credential: the error names it and its place, never a value.
        let only_other = |name: &str| (name == "other-token").then(|| "tok".to_string());
        let err = t.render(&Runner::in_process(), &input, &only_other).unwrap_err();
        assert!(matches!(err, ExprError::Credential(_)), "{err:?}");
        let err = err.to_string();
        check(&err, err.contains("unknown credential `API_KEY`") && err.contains("/auth"), true);
        check(&err, err.contains("tok") || err.contains("s3cret"), false);
    }

    #[test]
    fn template_compile_errors_carry_the_json_path() {
        let cases = [
            (json!("${.a +}"), "", "expected term"),
            (json!({"body": {"summary": "${.a +}"}}), "/body/summary", "hole `${.a +}`"),
            (json!({"list": [1, "ok ${.x}", "bad ${foo}"]}), "/list/2", "undefined filter `foo/0`"),
            (json!({"a/b": {"m~n": "${"}}), "/a~1b/m~0n", "without its closing"),
            (json!({"x": "${ \"} }"}), "/x", "unterminated string literal"),
            (json!({"x": "${ (.a }"}), "/x", "closes an open `(`"),
            (json!({"x": "${}"}), "/x", "empty hole"),
            (json!({"x": "${  }"}), "/x", "empty hole"),
            (json!({"x": "${credentials.}"}), "/x", "credentials.NAME"),
            (json!({"x": "${credentials.a.b}"}), "/x", "credentials.NAME"),
            (json!({"x": "${credentials.a | ascii}"}), "/x", "credentials.NAME"),
            (json!({"x": "${env.HOME}"}), "/x", "`env` is not available"),
        ];
        for (template, path, reason) in cases {
            let case = template.to_string();
            let (got_path, got_reason) = Template::compile(&template).expect_err(&case);
            check(
                &format!("{case}: {got_reason}"),
                (got_path.as_str(), got_reason.to_string().contains(reason)),
                (path, true),
            );
        }
    }

    #[test]
    fn template_render_errors_name_the_place() {
        let t = Template::compile(&json!({"a": [{"b": "x ${.s + 1}"}]})).unwrap();
        let err = t.render(&Runner::in_process(), &json!({"s": "str"}), &no_credentials).unwrap_err();
        assert!(matches!(err, ExprError::Raised(_)), "{err:?}");
        let err = err.to_string();
        check(&err, err.starts_with("/a/0/b: hole `${.s + 1}`: cannot"), true);
    }
}
