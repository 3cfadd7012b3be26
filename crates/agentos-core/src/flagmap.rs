//! The one mapping from an operation's input JSON Schema to command-line flags. Parsing, `--help`
//! and the system prompt all read the same table, so they can never disagree.

use serde_json::{Map, Value};

pub use agentos_openapi::dataurl::{DataUrl, FILE_MARK, mark_file, unmark_file};
pub use jsonschema::Validator;

/// What a flag takes.
#[derive(Debug, Clone, PartialEq)]
pub enum FlagType {
    String,
    /// Finite.
    Number,
    /// Whole: `1.5` and `three` are refused.
    Integer,
    /// `--x` / `--no-x`.
    Boolean,
    /// One of these values.
    Enum(Vec<Value>),
    /// Repeat the flag, one item each.
    Array(Box<FlagType>),
    /// A JSON value (objects without declared properties, and anything the table cannot spell).
    Json,
}

impl FlagType {
    /// How `--help` and the prompt show the value.
    pub fn placeholder(&self) -> String {
        match self {
            FlagType::String => "<string>".into(),
            FlagType::Number => "<number>".into(),
            FlagType::Integer => "<integer>".into(),
            FlagType::Boolean => String::new(),
            FlagType::Enum(vs) => {
                // Inert: a value's JSON keeps what JSON does not escape (a bidirectional override
                // in an object's text).
                let names: Vec<String> =
                    vs.iter().map(|v| crate::name::inert(&choice_text(v, vs)).into_owned()).collect();
                format!("<{}>", names.join("|"))
            }
            // A list of booleans takes its values written out: `--flags true --flags false`.
            FlagType::Array(item) if **item == FlagType::Boolean => "<true|false>...".into(),
            FlagType::Array(item) => format!("{}...", item.placeholder()),
            FlagType::Json => "<json>".into(),
        }
    }
}

/// How a choice of an enum is written: a string as its text, anything else as its JSON; and a
/// string whose text is the JSON of another choice (`"1"` beside `1`, `"null"` beside `null`)
/// as its JSON too, quoted, so the two read apart and each can be typed (`--e 1`, `--e '"1"'`).
pub fn choice_text(v: &Value, choices: &[Value]) -> String {
    match v.as_str() {
        Some(s)
            if !serde_json::from_str::<Value>(s).is_ok_and(|other| !other.is_string() && choices.contains(&other)) =>
        {
            s.to_string()
        }
        _ => v.to_string(),
    }
}

/// One flag.
#[derive(Debug, Clone, PartialEq)]
pub struct FlagSpec {
    /// Without the dashes: `full-page-url`, `where.lat`.
    pub flag: String,
    /// Where the value goes in the input: `["where", "lat"]`.
    pub path: Vec<String>,
    pub ty: FlagType,
    /// Required by the schema and without a default.
    pub required: bool,
    pub default: Option<Value>,
    pub description: String,
    /// A string of bytes rather than text (`format: binary`, `contentMediaType`, or an array of
    /// them): the value may be a `data:` URL, and `--FLAG-file` sends the file's bytes as one.
    pub binary: bool,
    /// A string of base64 (`format: byte`, `contentEncoding: base64`): `--FLAG-file` sends the
    /// file's bytes encoded, whatever they are.
    pub base64: bool,
    /// A number, integer or boolean that may also be `null` (`"type": ["integer", "null"]`):
    /// the flag takes `null` as well (`--limit null`, `--strict=null`). A string or list that
    /// may be null takes `null` as the text it is, and `--no-x` for null ([`Self::null_form`]).
    pub nullable: bool,
    /// A string or list flag whose schema allows `null` (`Optional[str]`, `Optional[List[str]]`):
    /// `--no-x` sends null, which `--x null` cannot say (it is the text `null`, or a list of it).
    pub null_form: bool,
    /// The JSON types of a flag of several (`"type": ["integer", "string"]`), read as JSON:
    /// a value whose JSON is of none of them is taken as the text it is when `string` is one
    /// (`true` for `[integer, string]` is the string "true"). For a list, its items' types.
    /// Empty for every other flag.
    pub json_types: Vec<String>,
}

impl FlagSpec {
    /// Whether `--no-x` is a flag too: false for a boolean, null for a [`null_form`](Self::null_form) one.
    pub fn takes_no_form(&self) -> bool {
        self.ty == FlagType::Boolean || self.null_form
    }

    /// How `--help` shows the value: the type's placeholder, with `|null` when it may be null
    /// (`<integer|null>`, `<true|false|null>` for a boolean).
    pub fn placeholder(&self) -> String {
        // A flag of several types names them (`<integer|string>`), not `<json>`: a value of none
        // of them is still read as JSON. A list's items the same (`<integer|string>...`).
        if !self.json_types.is_empty() {
            let types = format!("<{}>", self.json_types.join("|"));
            return if matches!(self.ty, FlagType::Array(_)) { format!("{types}...") } else { types };
        }
        with_null(self.ty.placeholder(), self)
    }
}

/// A placeholder with `|null` added when the flag takes a null.
pub fn with_null(placeholder: String, spec: &FlagSpec) -> String {
    match (spec.nullable, &spec.ty) {
        (false, _) => placeholder,
        (true, FlagType::Boolean) => "<true|false|null>".into(),
        (true, _) => match placeholder.strip_suffix('>') {
            Some(open) => format!("{open}|null>"),
            None => format!("{placeholder}|null"),
        },
    }
}

/// Every flag of one operation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlagTable {
    pub flags: Vec<FlagSpec>,
    /// Every nested object that has flags, with whether its parent requires it (and it has no
    /// default), and its default. Defaults inside an object are only filled in when the object
    /// is there or must be: nothing in `flags` says whether an object is optional once its
    /// fields have defaults. An object's own default is filled in where its parent is.
    objects: Vec<ObjectSpec>,
}

/// A nested object that has flags (`--where.lat`).
#[derive(Debug, Clone, PartialEq, Default)]
struct ObjectSpec {
    path: Vec<String>,
    /// Its flags' prefix (`where` of `--where.lat`).
    flag: String,
    /// Its parent requires it, and it has no default.
    required: bool,
    default: Option<Value>,
    /// It may be null (`Optional[SubModel]`): `--no-{flag}` sends null for the whole object,
    /// which no flag of its fields can say. False when that name is another flag's.
    null_form: bool,
}

/// `fullPageURL` → `full-page-url`; `snake_case` → `snake-case`.
pub fn kebab(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c == '_' || c == ' ' {
            out.push('-');
            continue;
        }
        if c.is_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            // A boundary before an upper-case letter that follows a lower-case one or a digit
            // (`fullPage`), or that starts a word after an acronym (`URLParser` → url-parser).
            if (prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower))
                && !out.ends_with('-')
            {
                out.push('-');
            }
        }
        out.extend(c.to_lowercase());
    }
    out
}

fn type_of(schema: &Value) -> Option<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        // `["string", "null"]`: the first non-null type.
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ => None,
    }
}

/// Whether a schema's `type` list allows `null` beside a number, integer or boolean: the types
/// whose flag can read `null` without taking it for a value of the type.
fn nullable(schema: &Value) -> bool {
    let Some(Value::Array(ts)) = schema.get("type") else { return false };
    ts.iter().any(|t| t == "null") && matches!(scalar(schema), FlagType::Number | FlagType::Integer | FlagType::Boolean)
}

/// Whether a string or list flag's schema allows `null` (a type list with `null`, as
/// [`flag_schema`] also writes an `Optional` one): its flag takes `--no-x` for null.
fn null_form(schema: &Value) -> bool {
    let Some(Value::Array(ts)) = schema.get("type") else { return false };
    ts.iter().any(|t| t == "null") && matches!(scalar(schema), FlagType::String | FlagType::Array(_))
}

fn scalar(schema: &Value) -> FlagType {
    if let Some(Value::Array(vs)) = schema.get("enum") {
        return FlagType::Enum(vs.clone());
    }
    if let Some(c) = schema.get("const") {
        return FlagType::Enum(vec![c.clone()]);
    }
    // Several types (`[integer, string]`, OpenAPI 3.1): the value is read as JSON when it is
    // JSON and as text otherwise, so `5` is the integer and `abc` the string. The first type
    // alone refused every value of the others.
    if let Some(Value::Array(ts)) = schema.get("type")
        && ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").count() > 1
    {
        return FlagType::Json;
    }
    match type_of(schema) {
        Some("string") => FlagType::String,
        Some("number") => FlagType::Number,
        Some("integer") => FlagType::Integer,
        Some("boolean") => FlagType::Boolean,
        Some("array") => match schema.get("items") {
            Some(items) if !matches!(scalar(items), FlagType::Array(_)) => FlagType::Array(Box::new(scalar(items))),
            _ => FlagType::Array(Box::new(FlagType::Json)),
        },
        _ => FlagType::Json,
    }
}

/// A string schema of bytes: `format: binary` (OpenAPI) or `contentMediaType` (JSON Schema).
fn is_binary(schema: &Value) -> bool {
    type_of(schema) == Some("string")
        && (schema.get("format").and_then(Value::as_str) == Some("binary") || schema.get("contentMediaType").is_some())
}

fn is_base64(schema: &Value) -> bool {
    type_of(schema) == Some("string")
        && !is_binary(schema)
        && (schema.get("format").and_then(Value::as_str) == Some("byte")
            || schema.get("contentEncoding").and_then(Value::as_str) == Some("base64"))
}

/// The last dotted part of a flag: the property's own (`lat` of `where.lat`).
fn last_part(flag: &str) -> &str {
    flag.rfind('.').map_or(flag, |i| &flag[i + 1..])
}

/// Whether a flag's part can be typed as `--part VALUE` and `--part=VALUE`: not empty, no `=`,
/// no white space or control character, not starting with `-`.
fn typeable(part: &str) -> bool {
    !part.is_empty()
        && !part.starts_with('-')
        && !part.chars().any(|c| c.is_whitespace() || c.is_control() || c == '=' || c == '.')
}

/// Builds the flag table of an input schema.
pub fn flag_table(schema: &Value) -> FlagTable {
    let mut table = FlagTable::default();
    collect(schema, &mut Vec::new(), &mut String::new(), true, &mut table);
    distinct_flags(&mut table);
    table
}

/// Flags every tool has, which no property's flag may be spelled as.
const OWN_FLAGS: [&str; 3] = ["json", "json-file", "help"];

/// Gives every property a flag of its own. Properties spelled alike once kebab-cased (`fooBar`,
/// `foo_bar`, `foo-bar`), one spelled as a tool's own flag (`help`, `json`), or as a boolean's
/// false form or a nullable string's or list's null form (`no-x` beside such an `x`) would share a flag, and all but one could not be set:
/// the first keeps the kebab-cased flag, each other one takes its property's own spelling
/// (`--foo_bar`) when that is a flag nothing else has or could have, else a number
/// (`--help-2`). A flag that collides with nothing keeps its name, whatever the others are
/// renamed to.
fn distinct_flags(table: &mut FlagTable) {
    use std::collections::HashSet;
    let negations: HashSet<String> =
        table.flags.iter().filter(|f| f.takes_no_form()).map(|f| format!("no-{}", f.flag)).collect();
    // First pass: which flags collide, and every name taken or that could be (the first of each
    // name, the tool's own flags, the booleans' false forms, the strings' `-file` forms).
    let mut kept: HashSet<String> = HashSet::new();
    let colliding: Vec<bool> = table
        .flags
        .iter()
        .map(|f| {
            OWN_FLAGS.contains(&f.flag.as_str())
                || negations.contains(&f.flag)
                || !kept.insert(f.flag.clone())
                || !typeable(last_part(&f.flag))
        })
        .collect();
    let mut taken: HashSet<String> = kept.into_iter().chain(negations.iter().cloned()).collect();
    taken.extend(OWN_FLAGS.iter().map(|f| f.to_string()));
    taken.extend(table.flags.iter().map(|f| format!("{}-file", f.flag)));
    // Second pass: a name of its own for each that collides, outside all of those.
    for (spec, _) in table.flags.iter_mut().zip(colliding).filter(|(_, c)| *c) {
        let parent = spec.flag.rfind('.').map_or("", |i| &spec.flag[..=i]);
        let own = spec.path.last().map(|p| format!("{parent}{p}")).filter(|own| typeable(&own[parent.len()..]));
        // A name no command line can give (`eq=x`, an empty one, one with a line break) is
        // spelled with `-` in place of what cannot be typed (`eq-x`), or `value` when nothing is left.
        let cleaned: String = last_part(&spec.flag)
            .chars()
            .map(|c| if c.is_whitespace() || c.is_control() || c == '=' || c == '.' { '-' } else { c })
            .collect::<String>()
            .split('-')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join("-");
        let base = format!("{parent}{}", if cleaned.is_empty() { "value" } else { &cleaned });
        spec.flag = match own.filter(|o| !taken.contains(o)) {
            Some(own) => own,
            None if base != spec.flag && !taken.contains(&base) => base,
            None => (2..).map(|n| format!("{base}-{n}")).find(|f| !taken.contains(f)).expect("a free number"),
        };
        taken.insert(spec.flag.clone());
    }
    // An object's null form (`--no-where`) yields to a flag's own name or false form as they are
    // once renamed, which came first (a property spelled `no-where`, a boolean `where_` beside
    // the object, one renamed to `where`), and to an earlier object's of the same spelling.
    let negations: HashSet<String> =
        table.flags.iter().filter(|f| f.takes_no_form()).map(|f| format!("no-{}", f.flag)).collect();
    let mut names: HashSet<String> = table.flags.iter().map(|f| f.flag.clone()).chain(negations).collect();
    for o in table.objects.iter_mut().filter(|o| o.null_form) {
        o.null_form = names.insert(format!("no-{}", o.flag));
    }
}

/// The schema a property's flag is built from. A property with no type of its own whose
/// `anyOf` or `oneOf` lists typed schemas (what Pydantic writes for `Optional[int]` or
/// `Union[int, str]`: `anyOf: [{type: integer}, {type: null}]`) is read as the one it would be
/// written as with a list of types: one schema beside `null` is that schema, nullable (an
/// object keeps its flags, an enum takes `null` among its choices); several scalar types are
/// `type: [integer, string]`. Left as it is, the flag took JSON: `--name 123` sent a number
/// to a field of text. Only the flag is read this way: the input is still checked against the
/// property as written.
fn flag_schema(prop: &Value) -> std::borrow::Cow<'_, Value> {
    use std::borrow::Cow;
    let Some(obj) = prop.as_object() else { return Cow::Borrowed(prop) };
    // A list's items are read the same way (`items: {anyOf: [...]}`).
    if let Some(items) = obj.get("items")
        && let Cow::Owned(read) = flag_schema(items)
    {
        let mut out = obj.clone();
        out.insert("items".into(), read);
        return Cow::Owned(Value::Object(out));
    }
    if ["type", "enum", "const", "properties", "items", "allOf", "$ref"].iter().any(|k| obj.contains_key(*k)) {
        return Cow::Borrowed(prop);
    }
    let branches = match (obj.get("anyOf"), obj.get("oneOf")) {
        (Some(Value::Array(b)), None) | (None, Some(Value::Array(b))) => b,
        _ => return Cow::Borrowed(prop),
    };
    let is_null = |b: &Value| {
        b.get("type").and_then(Value::as_str) == Some("null")
            && b.as_object().is_some_and(|o| o.keys().all(|k| matches!(k.as_str(), "type" | "title" | "description")))
    };
    let has_null = branches.iter().any(is_null);
    let others: Vec<&Value> = branches.iter().filter(|b| !is_null(b)).collect();
    // Outside the branches: what describes the property, which the branch's own words yield to.
    let mut out: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "anyOf" | "oneOf"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    match others.as_slice() {
        [one] => {
            let Some(branch) = one.as_object() else { return Cow::Borrowed(prop) };
            if !["type", "enum", "const"].iter().any(|k| branch.contains_key(*k)) {
                return Cow::Borrowed(prop);
            }
            for (k, v) in branch {
                out.entry(k.clone()).or_insert_with(|| v.clone());
            }
            if has_null {
                // One value beside null is a choice of two, not a value filled in.
                if let Some(c) = out.remove("const") {
                    out.insert("enum".into(), Value::Array(vec![c]));
                }
                if let Some(Value::Array(choices)) = out.get_mut("enum")
                    && !choices.contains(&Value::Null)
                {
                    choices.push(Value::Null);
                }
                match out.get_mut("type") {
                    Some(Value::String(t)) => {
                        let t = std::mem::take(t);
                        out.insert("type".into(), Value::Array(vec![Value::String(t), Value::String("null".into())]));
                    }
                    Some(Value::Array(ts)) if !ts.iter().any(|t| t == "null") => ts.push(Value::String("null".into())),
                    _ => {}
                }
            }
            // The branch's list items, read the same way (`Optional[List[Optional[str]]]`).
            if let Some(items) = out.get("items")
                && let Cow::Owned(read) = flag_schema(items)
            {
                out.insert("items".into(), read);
            }
        }
        [] => return Cow::Borrowed(prop),
        several => {
            // Several scalar types, each a bare type: their list. Anything richer (an enum, an
            // object, a format) is left to JSON.
            let mut types: Vec<Value> = Vec::new();
            for b in several {
                let bare = b
                    .as_object()
                    .is_some_and(|o| o.keys().all(|k| matches!(k.as_str(), "type" | "description" | "title")));
                match b.get("type").and_then(Value::as_str) {
                    Some(t @ ("string" | "integer" | "number" | "boolean")) if bare => {
                        if !types.iter().any(|x| x == t) {
                            types.push(Value::String(t.into()));
                        }
                    }
                    _ => return Cow::Borrowed(prop),
                }
            }
            if has_null {
                types.push(Value::String("null".into()));
            }
            out.insert("type".into(), Value::Array(types));
        }
    }
    Cow::Owned(Value::Object(out))
}

fn collect(schema: &Value, path: &mut Vec<String>, prefix: &mut String, parent_required: bool, table: &mut FlagTable) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else { return };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, prop) in props {
        let prop = flag_schema(prop);
        let prop = &*prop;
        let flag = if prefix.is_empty() { kebab(name) } else { format!("{prefix}.{}", kebab(name)) };
        path.push(name.clone());
        // A required field with one allowed value (`const`, or an enum of one: a discriminator
        // such as `type: realtime`) has that value by default: the caller has nothing to choose.
        // An optional one stays out unless given.
        let default = prop.get("default").cloned().or_else(|| match scalar(prop) {
            FlagType::Enum(vs) if vs.len() == 1 && required.contains(&name.as_str()) => vs.into_iter().next(),
            _ => None,
        });
        let is_required = parent_required && required.contains(&name.as_str()) && default.is_none();
        let nested = type_of(prop) == Some("object")
            && prop.get("properties").and_then(Value::as_object).is_some_and(|p| !p.is_empty());
        if nested {
            table.objects.push(ObjectSpec {
                path: path.clone(),
                flag: flag.clone(),
                required: required.contains(&name.as_str()) && default.is_none(),
                default: default.clone(),
                null_form: matches!(prop.get("type"), Some(Value::Array(ts)) if ts.iter().any(|t| t == "null"))
                    && typeable(last_part(&flag)),
            });
            let mut p = flag.clone();
            collect(prop, path, &mut p, is_required, table);
        } else {
            table.flags.push(FlagSpec {
                flag,
                path: path.clone(),
                ty: scalar(prop),
                required: is_required,
                default,
                description: prop.get("description").and_then(Value::as_str).unwrap_or("").to_string(),
                binary: is_binary(prop) || prop.get("items").is_some_and(is_binary),
                base64: is_base64(prop),
                nullable: nullable(prop),
                null_form: null_form(prop),
                json_types: match (scalar(prop), prop.get("type")) {
                    (FlagType::Json, Some(Value::Array(ts))) => {
                        ts.iter().filter_map(Value::as_str).map(str::to_string).collect()
                    }
                    // A list of items of several types: each item is read as a flag of them.
                    (FlagType::Array(item), _) if *item == FlagType::Json => {
                        match prop.get("items").and_then(|i| i.get("type")) {
                            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).map(str::to_string).collect(),
                            _ => Vec::new(),
                        }
                    }
                    _ => Vec::new(),
                },
            });
        }
        path.pop();
    }
}

/// A usage error: one line that says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

impl FlagTable {
    fn find(&self, name: &str) -> Option<&FlagSpec> {
        self.flags.iter().find(|f| f.flag == name)
    }

    /// The string flag whose value `--{name}` reads from a file, as [`parse`](Self::parse) reads
    /// it: `--photo-file` gives `--photo` its file, unless `photo-file` is a flag of the tool's
    /// own (a property of that name), which then takes the path as written and nothing is read.
    pub fn file_flag(&self, name: &str) -> Option<&FlagSpec> {
        if self.find(name).is_some() || self.negated(name).is_some() {
            return None;
        }
        name.strip_suffix("-file")
            .and_then(|n| self.find(n))
            .filter(|s| matches!(&s.ty, FlagType::String) || s.ty == FlagType::Array(Box::new(FlagType::String)))
    }

    /// Whether `--{name}`, written without `=`, takes the argument after it as its value (when
    /// that does not start with `--`), as [`parse`](Self::parse) reads it: every flag but a
    /// boolean (`--x`, `--no-x`), and a string flag's `-file` form. An unknown flag takes nothing.
    pub fn takes_value(&self, name: &str) -> bool {
        match self.find(name) {
            Some(spec) => spec.ty != FlagType::Boolean,
            None => self.file_flag(name).is_some(),
        }
    }

    /// The flag that `--{name}` sets to false or null (`--no-x` for `--x`): a boolean, or a
    /// string or list that may be null.
    fn negated(&self, name: &str) -> Option<&FlagSpec> {
        name.strip_prefix("no-").and_then(|n| self.find(n)).filter(|s| s.takes_no_form())
    }

    /// The object that `--{name}` sets to null (`--no-where` for an `Optional` object `where`).
    fn nulled_object(&self, name: &str) -> Option<&ObjectSpec> {
        name.strip_prefix("no-").and_then(|n| self.objects.iter().find(|o| o.null_form && o.flag == n))
    }

    /// The `--no-{flag}` forms of the objects that may be null, with their paths: what `--help`
    /// lists beside the flags.
    pub fn null_objects(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.objects.iter().filter(|o| o.null_form).map(|o| (o.flag.as_str(), o.path.as_slice()))
    }

    /// The flag closest to `name`, for "did you mean".
    fn nearest(&self, name: &str) -> Option<String> {
        let mut names: Vec<String> = self.flags.iter().map(|f| f.flag.clone()).collect();
        names.extend(OWN_FLAGS.iter().map(|f| f.to_string()));
        // Callers often spell the property as the schema does (`--fullPageURL`, `--snake_case`),
        // which is far from its flag letter by letter but equal once kebab-cased.
        let kebabbed = kebab(name);
        // `--where` for an object spelled as `--where.lat`, `--where.lon`: its first field is
        // nearer than any look-alike.
        let prefix = format!("{kebabbed}.");
        if let Some(f) = self.flags.iter().find(|f| f.flag.starts_with(&prefix)) {
            return Some(f.flag.clone());
        }
        names
            .into_iter()
            .filter(|n| n != name)
            .map(|n| (levenshtein(name, &n).min(levenshtein(&kebabbed, &n)), n))
            .filter(|(d, n)| *d <= 3.max(n.len() / 3))
            .min()
            .map(|(_, n)| n)
    }

    /// Whether the object at `path` is in `input`, or required there (all the way up) so that its
    /// defaults belong in it. The top level always is.
    fn object_expected(&self, input: &Map<String, Value>, path: &[String]) -> bool {
        if path.is_empty() || get(input, path).is_some() {
            return true;
        }
        let required = self.objects.iter().any(|o| o.path.as_slice() == path && o.required);
        required && self.object_expected(input, &path[..path.len() - 1])
    }

    /// The `--flag` that sets the value at a JSON pointer into the input (`/where/lat` → `--where.lat`).
    pub fn flag_for_pointer(&self, pointer: &str) -> Option<&FlagSpec> {
        let parts: Vec<String> = pointer.split('/').skip(1).map(|p| p.replace("~1", "/").replace("~0", "~")).collect();
        // The longest flag path that is a prefix of the pointer (array items point into their flag).
        self.flags.iter().filter(|f| parts.starts_with(&f.path)).max_by_key(|f| f.path.len())
    }

    /// Parses tool arguments into the input object. `json_text` is what `--json-file` read.
    pub fn parse(&self, args: &[String]) -> Result<Value, UsageError> {
        // `--json` and flags are gathered apart and merged at the end, so that flags win over
        // `--json` wherever it stands, and a flag inside an object (`--where.lat`) keeps the rest of
        // the object `--json` gave. (Writing both into one map let a later `--json` overwrite
        // earlier flags, and replaced whole objects.)
        let mut json = Map::new();
        let mut input = Map::new();
        let mut set_flags: Vec<&FlagSpec> = Vec::new();
        // The string and list flags given as `--no-x` (null).
        let mut nulled: Vec<String> = Vec::new();
        // The booleans given, and whether as `--no-x`: `--x` beside `--no-x` is refused.
        let mut booleans: Vec<(&str, bool)> = Vec::new();
        // The objects given as `--no-x` (null): none of their fields' flags may be given too.
        let mut nulled_objects: Vec<&ObjectSpec> = Vec::new();
        let under_nulled = |spec: &FlagSpec, nulled_objects: &[&ObjectSpec]| -> Result<(), UsageError> {
            match nulled_objects.iter().find(|o| spec.path.starts_with(&o.path)) {
                Some(o) => Err(UsageError(object_both_given(o, &spec.flag))),
                None => Ok(()),
            }
        };
        let mut i = 0;
        let err = |m: String| Err(UsageError(m));
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            if arg == "--" {
                return err(
                    "`--` is not taken here: tools take flags only; a value that starts with `-` goes as --name=-value"
                        .into(),
                );
            }
            let Some(body) = arg.strip_prefix("--") else {
                return err(format!("unexpected argument {arg:?}: tools take flags only (see --help)"));
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            if name == "json" {
                let text = match inline.or_else(|| args.get(i).cloned().inspect(|_| i += 1)) {
                    Some(t) => t,
                    None => return err("--json needs a value: a JSON object".into()),
                };
                if text == "-" {
                    // The usual spelling of "standard input" elsewhere: say which flag reads it.
                    return err(
                        "--json takes the JSON text itself; to read it from standard input use --json-file -".into()
                    );
                }
                let v: Value =
                    serde_json::from_str(&text).map_err(|e| UsageError(format!("--json: not valid JSON: {e}")))?;
                let Value::Object(o) = v else { return err("--json: expected a JSON object".into()) };
                json.extend(o);
                continue;
            }
            if name == "json-file" {
                return err("--json-file must be read by the caller before parsing".into());
            }
            let (spec, negated) = match self.find(name) {
                Some(s) => (s, false),
                None => match self.negated(name) {
                    Some(s) => (s, true),
                    None if self.nulled_object(name).is_some() => {
                        let object = self.nulled_object(name).unwrap_or_else(|| unreachable!());
                        if inline.is_some() {
                            return err(format!("--no-{} takes no value (it sends null)", object.flag));
                        }
                        if let Some(given) = set_flags.iter().find(|s| s.path.starts_with(&object.path)) {
                            return err(object_both_given(object, &given.flag));
                        }
                        // A field inside it given as null (`--no-where.note`), or an object inside
                        // it (`--no-where.inner`), or the object it is in given as null.
                        let inner_null = nulled
                            .iter()
                            .filter_map(|f| self.find(f))
                            .find(|s| s.path.starts_with(&object.path))
                            .map(|s| format!("no-{}", s.flag))
                            .or_else(|| {
                                nulled_objects
                                    .iter()
                                    .find(|o| o.path.len() > object.path.len() && o.path.starts_with(&object.path))
                                    .map(|o| format!("no-{}", o.flag))
                            });
                        if let Some(inner) = inner_null {
                            return err(object_both_given(object, &inner));
                        }
                        if let Some(outer) = nulled_objects
                            .iter()
                            .find(|o| object.path.len() > o.path.len() && object.path.starts_with(&o.path))
                        {
                            return err(object_both_given(outer, &format!("no-{}", object.flag)));
                        }
                        if !nulled_objects.iter().any(|o| o.path == object.path) {
                            nulled_objects.push(object);
                        }
                        insert(&mut input, &object.path, Value::Null, false)
                            .map_err(|e| UsageError(format!("--no-{}: {e}", object.flag)))?;
                        continue;
                    }
                    None if self.file_flag(name).is_some() => {
                        let spec = self.file_flag(name).unwrap_or_else(|| unreachable!());
                        under_nulled(spec, &nulled_objects)?;
                        let next = args.get(i).filter(|n| !n.starts_with("--")).cloned().inspect(|_| i += 1);
                        let Some(raw) = inline.or(next) else {
                            return err(format!("--{name} needs a path"));
                        };
                        if nulled.contains(&spec.flag) {
                            return err(both_given(spec));
                        }
                        let value = file_value(spec, name, &raw)?;
                        if let Some(e) = given_twice(spec, &input, &value, &set_flags) {
                            return err(e);
                        }
                        if !set_flags.iter().any(|s| s.flag == spec.flag) {
                            set_flags.push(spec);
                        }
                        insert(&mut input, &spec.path, value, matches!(spec.ty, FlagType::Array(_)))
                            .map_err(|e| UsageError(format!("--{name}: {e}")))?;
                        continue;
                    }
                    None if name.strip_suffix("-file").and_then(|n| self.find(n)).is_some() => {
                        let spec =
                            name.strip_suffix("-file").and_then(|n| self.find(n)).unwrap_or_else(|| unreachable!());
                        return err(format!(
                            "--{}: only a string flag reads its value from a file; --{} takes {}",
                            name.escape_debug(),
                            spec.flag,
                            spec.ty.placeholder()
                        ));
                    }
                    None => {
                        let hint = self.nearest(name).map(|n| format!("; did you mean --{n}?")).unwrap_or_default();
                        // The name is the caller's text: escaped, so the error stays one line.
                        return err(format!("unknown flag --{}{hint}", name.escape_debug()));
                    }
                },
            };
            // `--no-x` of a string or list that may be null, and `--x` beside it, would each undo
            // the other: one of the two is a mistake, and which the caller meant is theirs to say.
            under_nulled(spec, &nulled_objects)?;
            let both =
                if negated { set_flags.iter().any(|s| s.flag == spec.flag) } else { nulled.contains(&spec.flag) };
            if both && spec.null_form {
                return err(both_given(spec));
            }
            if negated && spec.null_form {
                if inline.is_some() {
                    return err(format!("--no-{} takes no value (it sends null)", spec.flag));
                }
                nulled.push(spec.flag.clone());
                insert(&mut input, &spec.path, Value::Null, false)
                    .map_err(|e| UsageError(format!("--no-{}: {e}", spec.flag)))?;
                continue;
            }
            let value = if spec.ty == FlagType::Boolean {
                // `--overwrite-file=true` from a shell command arrives marked as a file it read.
                let inline = inline.map(|v| unmark_file(&v).map_or(v.clone(), |(path, _)| path.to_string()));
                let value = match (negated, inline.as_deref()) {
                    (true, None) => Value::Bool(false),
                    // `name` already reads `no-…`.
                    (true, Some(_)) => return err(format!("--no-{} takes no value", spec.flag)),
                    (false, None) => Value::Bool(true),
                    (false, Some("true")) => Value::Bool(true),
                    (false, Some("false")) => Value::Bool(false),
                    (false, Some("null")) if spec.nullable => Value::Null,
                    (false, Some(v)) => {
                        let or_null = if spec.nullable { ", or null" } else { "" };
                        return err(format!("--{}: expected true or false{or_null}, got {v:?}", spec.flag));
                    }
                };
                // As for text: `--x` and `--no-x` that disagree each undo the other, and which
                // was meant is the caller's to say (the last one won, so a mistake passed
                // unseen). Two that agree (`--x=false --no-x`) are taken; two of one form that
                // disagree (`--x --x=false`) are refused below as any flag given twice.
                let before = set_flags.iter().any(|s| s.flag == spec.flag).then(|| get(&input, &spec.path)).flatten();
                if before.is_some_and(|b| !same_value(b, &value))
                    && booleans.iter().any(|(f, n)| *f == spec.flag && *n != negated)
                {
                    let f = &spec.flag;
                    return err(format!("--{f} and --no-{f} are both given: give one of them"));
                }
                booleans.push((&spec.flag, negated));
                value
            } else {
                let raw = match inline {
                    Some(v) => v,
                    None => match args.get(i) {
                        // A negative number is a value; another flag is not.
                        Some(next) if !next.starts_with("--") => {
                            i += 1;
                            next.clone()
                        }
                        _ => return err(format!("--{} needs a value ({})", spec.flag, spec.placeholder())),
                    },
                };
                let item_ty = match &spec.ty {
                    FlagType::Array(item) => item.as_ref(),
                    t => t,
                };
                match unmark_file(&raw) {
                    // `--x-file` that is a flag of its own: the path, as the caller wrote it.
                    Some((path, _)) => convert(&spec.flag, item_ty, path)?,
                    None if spec.nullable && raw.trim() == "null" => Value::Null,
                    None => of_its_types(convert(&spec.flag, item_ty, &raw).map_err(|e| or_null(e, spec))?, &raw, spec),
                }
            };
            if let Some(e) = given_twice(spec, &input, &value, &set_flags) {
                return err(e);
            }
            if !set_flags.iter().any(|s| s.flag == spec.flag) {
                set_flags.push(spec);
            }
            insert(&mut input, &spec.path, value, matches!(spec.ty, FlagType::Array(_)))
                .map_err(|e| UsageError(format!("--{}: {e}", spec.flag)))?;
        }
        overlay(&mut json, input);
        match self.completed(json) {
            (_, Some(missing)) => err(format!("Missing required flag: --{}", missing.flag)),
            (input, None) => Ok(Value::Object(input)),
        }
    }

    /// An input given as JSON (an MCP client's arguments, a net's) with the defaults filled in
    /// as they are for flags, so that a tool gets the same input however it is called. Whether
    /// it is complete and valid is the schema's to say.
    pub fn with_defaults(&self, input: Map<String, Value>) -> Map<String, Value> {
        self.completed(input).0
    }

    /// `input` with its defaults, and the first required field that has neither value nor
    /// default, if one has not. A field under an object given as something else (`null` for a
    /// nullable one) is not asked for: it has no place to be in.
    fn completed(&self, mut input: Map<String, Value>) -> (Map<String, Value>, Option<&FlagSpec>) {
        let mut missing = None;
        // An object's own default first, where its parent is and it is not given (outer objects
        // come first), so that the defaults and required fields inside it then apply to it. As
        // JSON Schema has it, a default stands for a value left out: an object given in part
        // (`--where.lon 3`) is the caller's, and is not merged with it.
        for ObjectSpec { path, default, .. } in &self.objects {
            if let Some(d) = default
                && get(&input, path).is_none()
                && self.object_expected(&input, &path[..path.len() - 1])
            {
                let _ = insert(&mut input, path, d.clone(), false);
            }
        }
        // Defaults are honoured; fields with one are never required. A default inside an object
        // that is neither given nor required is left out: filling it in would conjure up an
        // optional object the caller never asked for, and fail on that object's required fields.
        for spec in &self.flags {
            if get(&input, &spec.path).is_none() {
                if let Some(d) = &spec.default {
                    if self.object_expected(&input, &spec.path[..spec.path.len() - 1]) {
                        let _ = insert(&mut input, &spec.path, d.clone(), false);
                    }
                } else if spec.required && missing.is_none() && in_objects(&input, &spec.path) {
                    missing = Some(spec);
                }
            }
        }
        (input, missing)
    }
}

/// Whether every object `path` goes through is absent or an object: a value could stand there.
fn in_objects(input: &Map<String, Value>, path: &[String]) -> bool {
    (1..path.len()).all(|n| get(input, &path[..n]).is_none_or(Value::is_object))
}

/// `--x` and `--no-x` (null) of one string or list flag, given together.
fn both_given(spec: &FlagSpec) -> String {
    let f = &spec.flag;
    format!("--{f} and --no-{f} are both given: --no-{f} sends null; give one of them")
}

/// A flag of one value given again with another: the first value would be dropped unseen (the
/// last one won). A list's flag repeats; the same value twice is taken. The values are not
/// shown: one may be a file's content or a secret.
fn given_twice(spec: &FlagSpec, input: &Map<String, Value>, value: &Value, set: &[&FlagSpec]) -> Option<String> {
    if matches!(spec.ty, FlagType::Array(_)) || !set.iter().any(|s| s.flag == spec.flag) {
        return None;
    }
    let before = get(input, &spec.path)?;
    (!same_value(before, value)).then(|| {
        format!(
            "--{} is given twice, with different values: it takes one value (only a list's flag repeats); give it once",
            spec.flag
        )
    })
}

/// Whether two values a flag read are the same: numbers by value (`1` and `1.0`).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64().is_some_and(|x| Some(x) == y.as_f64()),
        _ => a == b,
    }
}

/// A field's flag and `--no-x` of the object it is in (null for the whole object), given together.
fn object_both_given(object: &ObjectSpec, field: &str) -> String {
    let o = &object.flag;
    format!("--{field} and --no-{o} are both given: --no-{o} sends null for the whole of {o}; give one of them")
}

/// A value refused by a flag that also takes `null` says so: "expected an integer, or null".
fn or_null(e: UsageError, spec: &FlagSpec) -> UsageError {
    if !spec.nullable {
        return e;
    }
    match e.0.split_once(", got ") {
        Some((head, tail)) => UsageError(format!("{head}, or null, got {tail}")),
        None => e,
    }
}

/// The value of `--{flag}-file`: what the shell command read from the file (see [`FILE_MARK`]),
/// as the data URL for a binary flag and as text for any other string flag.
fn file_value(spec: &FlagSpec, given_as: &str, raw: &str) -> Result<Value, UsageError> {
    let Some((path, content)) = unmark_file(raw) else {
        return Err(UsageError(format!(
            "--{given_as} takes a path that the agentos-<toolkit> shell command reads; over the API, send the content as --{} (a data: URL for bytes)",
            spec.flag
        )));
    };
    let url = content.map_err(|why| UsageError(format!("--{given_as} {path}: {why}")))?;
    if spec.binary {
        return Ok(Value::String(url.to_string()));
    }
    let file =
        DataUrl::parse(url).ok_or_else(|| UsageError(format!("--{given_as} {path}: the file did not arrive whole")))?;
    if spec.base64 {
        return Ok(Value::String(file.base64()));
    }
    String::from_utf8(file.bytes).map(Value::String).map_err(|_| {
        UsageError(format!("--{given_as} {path}: not UTF-8 text, and --{} takes text, not bytes", spec.flag))
    })
}

/// Puts the flags' values over `--json`'s: objects merge, anything else is replaced (a repeated
/// flag's list replaces the list `--json` gave).
fn overlay(base: &mut Map<String, Value>, flags: Map<String, Value>) {
    for (k, v) in flags {
        match (base.get_mut(&k), v) {
            (Some(Value::Object(b)), Value::Object(o)) => overlay(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// A value read as JSON for a flag of several types, as one of them: when its JSON is of none
/// and `string` is one, the text as typed (`--id true` for `[integer, string]` is "true", not
/// the boolean the schema would refuse).
fn of_its_types(v: Value, raw: &str, spec: &FlagSpec) -> Value {
    let is = |t: &str| match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => true,
    };
    let types = &spec.json_types;
    if types.is_empty() || !types.iter().any(|t| t == "string") {
        return v;
    }
    // A number JSON cannot keep as written (past 64 bits, more digits than a double holds) is
    // the text, which the string type keeps whole.
    let written = serde_json::to_string(&v).unwrap_or_default();
    let kept = !v.is_number() || written == raw.trim() || v.as_f64().is_some_and(|f| f.to_string() == raw.trim());
    if kept && types.iter().any(|t| is(t)) {
        return v;
    }
    Value::String(raw.to_string())
}

/// A whole number as JSON writes it: signed, or unsigned beyond `i64`.
fn whole(raw: &str) -> Option<Value> {
    raw.parse::<i64>().map(Value::from).or_else(|_| raw.parse::<u64>().map(Value::from)).ok()
}

fn convert(flag: &str, ty: &FlagType, raw: &str) -> Result<Value, UsageError> {
    let bad = |what: &str| UsageError(format!("--{flag}: expected {what}, got {raw:?}"));
    Ok(match ty {
        FlagType::String => Value::String(raw.to_string()),
        // `--lat 41` stays the integer 41, as `--json '{"lat": 41}'` gives it, rather than 41.0
        // (which also showed in errors: "-91.0 is less than the minimum of -90").
        FlagType::Number => match whole(raw.trim()) {
            Some(n) => n,
            None => {
                let n: f64 = raw.trim().parse().map_err(|_| bad("a number"))?;
                if !n.is_finite() {
                    return Err(bad("a finite number"));
                }
                serde_json::Number::from_f64(n).map(Value::Number).ok_or_else(|| bad("a finite number"))?
            }
        },
        FlagType::Integer => match whole(raw.trim()) {
            Some(n) => n,
            // All digits, only too long for 64 bits: said as such, not as "not an integer".
            None if raw.trim().trim_start_matches(['-', '+']).len() + 1 >= raw.trim().len()
                && raw.trim().trim_start_matches(['-', '+']).bytes().all(|b| b.is_ascii_digit())
                && raw.trim().len() > 18 =>
            {
                return Err(UsageError(format!(
                    "--{flag}: {} is out of range: integers go from {} to {}",
                    raw.trim(),
                    i64::MIN,
                    u64::MAX
                )));
            }
            None => return Err(bad("an integer")),
        },
        FlagType::Boolean => match raw {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err(bad("true or false")),
        },
        FlagType::Enum(choices) => {
            // A choice that is not a string matches its JSON (`1`, `null`); then a string choice
            // matches its text; then its JSON (`"a"`). So beside a string "1" the number 1 is
            // typed `1` and the string `"1"`, as the placeholder writes them ([`choice_text`]),
            // and a string that holds quotes (`"a"` beside `a`) is still its own text.
            let as_json = serde_json::from_str::<Value>(raw).ok();
            let found = as_json
                .as_ref()
                .filter(|v| !v.is_string())
                .and_then(|v| choices.iter().find(|c| *c == v))
                .or_else(|| choices.iter().find(|c| c.as_str() == Some(raw)))
                .or_else(|| as_json.as_ref().and_then(|v| choices.iter().find(|c| *c == v)));
            match found {
                Some(v) => v.clone(),
                None => {
                    // The registrant's text: inert, so the error stays one line.
                    let names: Vec<String> =
                        choices.iter().map(|v| crate::name::inert(&choice_text(v, choices)).into_owned()).collect();
                    return Err(UsageError(format!("--{flag}: {raw:?} is not one of {}", names.join(", "))));
                }
            }
        }
        FlagType::Array(_) | FlagType::Json => serde_json::from_str(raw)
            .or_else(|_| if matches!(ty, FlagType::Json) { Ok(Value::String(raw.to_string())) } else { Err(()) })
            .map_err(|_| bad("JSON"))?,
    })
}

fn get<'a>(input: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (last, parents) = path.split_last()?;
    let mut cur = input;
    for p in parents {
        cur = cur.get(p)?.as_object()?;
    }
    cur.get(last)
}

fn insert(input: &mut Map<String, Value>, path: &[String], value: Value, append: bool) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("empty path")?;
    let mut cur = input;
    for p in parents {
        let slot = cur.entry(p.clone()).or_insert_with(|| Value::Object(Map::new()));
        cur = slot.as_object_mut().ok_or_else(|| format!("{p} is set to a value that is not an object"))?;
    }
    if append {
        match cur.entry(last.clone()).or_insert_with(|| Value::Array(Vec::new())) {
            Value::Array(a) => a.push(value),
            _ => return Err("set both with --json and as a list".into()),
        }
    } else {
        cur.insert(last.clone(), value);
    }
    Ok(())
}

/// The error that says what is wrong: for a value no branch of an `anyOf` or `oneOf` takes
/// (`Optional[int]` with a maximum, say), the one branch whose refusal is more than a type
/// that does not match (`11 is greater than the maximum of 10`, not "11 is not valid under any
/// of the schemas listed"), looked into the same way; the error itself when no single branch
/// stands out.
fn telling<'a>(e: &'a jsonschema::ValidationError<'a>) -> &'a jsonschema::ValidationError<'a> {
    use jsonschema::error::ValidationErrorKind as K;
    let (K::AnyOf { context } | K::OneOfNotValid { context }) = e.kind() else { return e };
    let mut near = context.iter().filter(|branch| branch.iter().any(|x| !matches!(x.kind(), K::Type { .. })));
    match (near.next(), near.next()) {
        (Some(branch), None) => match branch.iter().find(|x| !matches!(x.kind(), K::Type { .. })) {
            Some(x) => telling(x),
            None => e,
        },
        _ => e,
    }
}

/// Validates `input` against the whole schema; errors name the flag when one maps to the path.
pub fn validate(schema: &Value, table: &FlagTable, input: &Value) -> Result<(), UsageError> {
    validate_with(compile(schema).as_ref(), table, input)
}

/// The validator of a whole input schema, for [`validate_with`]; `None` for a schema the
/// validator cannot read, which is the tool's fault, not the caller's: the flag-level checks
/// still run, and nothing else is checked.
pub fn compile(schema: &Value) -> Option<Validator> {
    jsonschema::validator_for(schema).ok()
}

/// The top-level property of `table` nearest to `name`, among those `input` does not set: equal
/// once kebab-cased or case-folded, or a third of its letters away at most (one for a short
/// name, so that `url` is not taken for `id`).
fn nearest_property<'a>(table: &'a FlagTable, name: &str, input: &Value) -> Option<&'a str> {
    let (kebabbed, folded) = (kebab(name), name.to_lowercase());
    table
        .flags
        .iter()
        .filter(|f| f.path.len() == 1 && input.get(&f.path[0]).is_none())
        .map(|f| {
            let p = f.path[0].as_str();
            let d =
                levenshtein(name, p).min(levenshtein(&kebabbed, &f.flag)).min(levenshtein(&folded, &p.to_lowercase()));
            (d, p)
        })
        .filter(|(d, p)| *d <= (p.len() / 3).max(1))
        .min()
        .map(|(_, p)| p)
}

/// [`validate`] with the schema's validator compiled already (`None`: nothing to check).
pub fn validate_with(validator: Option<&Validator>, table: &FlagTable, input: &Value) -> Result<(), UsageError> {
    let Some(validator) = validator else { return Ok(()) };
    let Some(first) = validator.iter_errors(input).next() else { return Ok(()) };
    let error = telling(&first);
    let mut pointer = error.instance_path().to_string();
    // A missing property is reported at its parent object (`/near`); the flag to name is the
    // property's own (`--near.lon`), when it has one.
    if let jsonschema::error::ValidationErrorKind::Required { property: Value::String(p) } = error.kind() {
        let child = format!("{pointer}/{}", p.replace('~', "~0").replace('/', "~1"));
        if table.flag_for_pointer(&child).is_some() {
            pointer = child;
        }
    }
    let at = match table.flag_for_pointer(&pointer) {
        Some(f) => format!("--{}", f.flag),
        None if pointer.is_empty() => "input".to_string(),
        None => format!("input at {pointer}"),
    };
    // A property misspelt, or spelt as a document spells it (`fullPageURL`) where the input
    // takes another (`full-page-url`): name the one meant.
    let hint = match error.kind() {
        jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected }
            if pointer.is_empty() && unexpected.len() == 1 && unexpected[0].len() <= 128 =>
        {
            nearest_property(table, &unexpected[0], input).map(|p| format!("; did you mean {p:?}?"))
        }
        _ => None,
    };
    // The validator quotes some of the input raw (property names in `additionalProperties`):
    // escape line breaks so the error stays one line.
    let message = format!("{at}: {error}{}", hint.unwrap_or_default()).replace('\n', "\\n").replace('\r', "\\r");
    Err(UsageError(message))
}
