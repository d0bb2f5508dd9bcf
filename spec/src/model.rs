//! `ops.toml` read and checked: the operators in slot order, the args
//! structs they take, and every field's rules, with each cross-reference
//! resolved. A spec that breaks a rule of the file's header (an unknown
//! args struct, a shape relation naming no tensor, a field appended
//! without a default...) is refused with a message naming the entry.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

/// The whole operator list.
#[derive(Debug)]
pub struct Spec {
    /// Operators in op-table slot order.
    pub ops: Vec<Op>,
    /// Args structs in the order the op table first uses them (the order
    /// cbindgen writes them into the header).
    pub args: Vec<Args>,
}

/// One op-table entry.
#[derive(Debug)]
pub struct Op {
    /// Its name (op-table field, method, messages).
    pub name: String,
    /// Index into [`Spec::args`].
    pub args: usize,
    /// The ABI version that introduced it.
    pub since: (u32, u32),
    /// Where docs list it.
    pub family: String,
    /// The dtypes `T` may be.
    pub dtypes: Vec<String>,
    /// Whether `dtypes` is every dtype ("any").
    pub any_dtype: bool,
    /// One line of documentation.
    pub doc: String,
    /// Fields whose dtype differs for this operator.
    pub retype: BTreeMap<String, DType>,
    /// Dtypes a later minor added to `dtypes` (they are in `dtypes` too),
    /// each with that minor's version: a host never passes one to a plugin
    /// of an older minor.
    pub added: Vec<(String, (u32, u32))>,
}

/// One args struct.
#[derive(Debug)]
pub struct Args {
    /// CamelCase name: `PolychipNameArgs` in C, `NameArgs` in the SDK.
    pub name: String,
    /// Header comment.
    pub doc: String,
    /// The shared method name, when its operators share one.
    pub group: Option<String>,
    /// What the hand-written rule checks, when there is one.
    pub rule: Option<String>,
    /// The host's options struct for the scalars.
    pub options: Option<String>,
    /// Members after `struct_size`.
    pub fields: Vec<Field>,
    /// Indices into [`Spec::ops`] of the operators taking it.
    pub ops: Vec<usize>,
    /// The earliest `since` of its operators.
    pub since: (u32, u32),
}

/// A field of an args struct.
#[derive(Debug)]
pub struct Field {
    /// Its name.
    pub name: String,
    /// Header comment.
    pub doc: String,
    /// The ABI version that appended it (the struct's own for the first ones).
    pub since: (u32, u32),
    /// Tensor or scalar.
    pub kind: Kind,
}

/// What a field holds.
#[derive(Debug)]
pub enum Kind {
    /// A tensor descriptor.
    Tensor(Tensor),
    /// A scalar.
    Scalar(Scalar),
}

/// A tensor field's rules.
#[derive(Debug)]
pub struct Tensor {
    /// Read, written, or both.
    pub role: Role,
    /// Its dtype rule.
    pub dtype: DType,
    /// Its rank, when constrained.
    pub layout: Option<Layout>,
    /// Its shape relative to another tensor.
    pub shape: Option<Shape>,
    /// Inputs it may be exactly (in place).
    pub alias: Vec<String>,
    /// The flag that says whether it is present.
    pub optional: Option<String>,
}

/// How a tensor is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Only read.
    In,
    /// Only written.
    Out,
    /// Read and written (in place, or accumulated into).
    InOut,
}

/// A tensor's dtype rule.
#[derive(Debug, Clone, PartialEq)]
pub enum DType {
    /// The operator's dtype, shared by every `T` tensor of a call.
    T,
    /// One of a fixed list (a set name or a single dtype), with its name.
    OneOf(String, Vec<String>),
}

/// A rank constraint, with the layout text messages show.
#[derive(Debug, Clone)]
pub struct Layout {
    /// As written: `[N, K]`, `[..., K]`, `[]`.
    pub text: String,
    /// Named dimensions.
    pub dims: usize,
    /// Whether leading `...` allows more.
    pub open: bool,
}

/// A shape relation to other tensors.
#[derive(Debug, Clone)]
pub enum Shape {
    /// Equal to that tensor's shape.
    Like(String),
    /// `[H]`, H being that tensor's last dimension.
    Last(String),
    /// That tensor's shape without its last dimension.
    Rows(String),
    /// The NumPy broadcast of these (two or more).
    Broadcast(Vec<String>),
    /// Any shape that broadcasts to that tensor's (a mask applied to it).
    BroadcastsTo(String),
}

/// A scalar field.
#[derive(Debug)]
pub struct Scalar {
    /// Its type.
    pub ty: ScalarType,
    /// Its default, as Rust source.
    pub default: Option<String>,
    /// The tensor it is a dimension of.
    pub dim_of: Option<String>,
}

/// A scalar's ABI type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarType {
    /// `double`.
    F64,
    /// `int64_t`.
    I64,
    /// `int32_t`.
    I32,
    /// `uint8_t`, nonzero meaning true.
    Flag,
}

impl ScalarType {
    /// The ABI struct's Rust type.
    pub fn abi(self) -> &'static str {
        match self {
            ScalarType::F64 => "f64",
            ScalarType::I64 => "i64",
            ScalarType::I32 => "i32",
            ScalarType::Flag => "u8",
        }
    }

    /// The type safe code sees.
    pub fn safe(self) -> &'static str {
        match self {
            ScalarType::Flag => "bool",
            other => other.abi(),
        }
    }
}

impl Field {
    /// The tensor rules, if a tensor.
    pub fn tensor(&self) -> Option<&Tensor> {
        match &self.kind {
            Kind::Tensor(t) => Some(t),
            Kind::Scalar(_) => None,
        }
    }

    /// The scalar, if a scalar.
    pub fn scalar(&self) -> Option<&Scalar> {
        match &self.kind {
            Kind::Scalar(s) => Some(s),
            Kind::Tensor(_) => None,
        }
    }
}

impl Args {
    /// The field called `name`.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Whether a flag field only says whether an optional tensor is there
    /// (safe code sees an `Option` instead).
    pub fn is_presence_flag(&self, name: &str) -> bool {
        self.fields
            .iter()
            .filter_map(Field::tensor)
            .any(|t| t.optional.as_deref() == Some(name))
    }

    /// The fields safe code sees, in ABI order: every tensor and every
    /// scalar except presence flags.
    pub fn safe_fields(&self) -> impl Iterator<Item = &Field> {
        self.fields
            .iter()
            .filter(|f| f.tensor().is_some() || !self.is_presence_flag(&f.name))
    }

    /// `snake_case` of the name (the rule function, group-less method names).
    pub fn snake(&self) -> String {
        snake(&self.name)
    }

    /// The enum naming its operators, when they share a method.
    pub fn group_enum(&self) -> Option<String> {
        self.group.as_ref().map(|g| format!("{}Op", camel(g)))
    }
}

/// `RmsNormBackward` -> `rms_norm_backward`.
pub fn snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `rms_norm_backward` -> `RmsNormBackward`.
pub fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// "1.1" -> (1, 1).
fn version(text: &str, what: &str) -> Result<(u32, u32), String> {
    let parse = || {
        let (major, minor) = text.split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    };
    parse().ok_or_else(|| format!("{what}: since {text:?} is not MAJOR.MINOR"))
}

const DTYPES: [&str; 8] = ["f32", "f16", "bf16", "f64", "i32", "i64", "u8", "bool"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    dtypes: BTreeMap<String, Vec<String>>,
    table: RawTable,
    args: BTreeMap<String, RawArgs>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    ops: Vec<RawOp>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOp {
    name: String,
    args: String,
    since: String,
    family: String,
    dtypes: toml::Value,
    doc: String,
    #[serde(default)]
    retype: BTreeMap<String, String>,
    #[serde(default)]
    added: BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawArgs {
    doc: String,
    group: Option<String>,
    rule: Option<String>,
    options: Option<String>,
    fields: Vec<RawField>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawField {
    #[serde(rename = "in")]
    input: Option<String>,
    out: Option<String>,
    inout: Option<String>,
    f64: Option<String>,
    i64: Option<String>,
    i32: Option<String>,
    flag: Option<String>,
    dtype: Option<String>,
    layout: Option<String>,
    shape: Option<String>,
    #[serde(default)]
    alias: Vec<String>,
    optional: Option<String>,
    default: Option<toml::Value>,
    dim_of: Option<String>,
    since: Option<String>,
    doc: String,
}

/// Reads and checks `ops.toml`'s text.
pub fn parse(text: &str) -> Result<Spec, String> {
    let raw: RawSpec = toml::from_str(text).map_err(|e| format!("ops.toml: {e}"))?;
    let sets = dtype_sets(&raw.dtypes)?;
    let mut order: Vec<String> = Vec::new();
    let mut ops = Vec::new();
    let mut names = BTreeSet::new();
    for (slot, op) in raw.table.ops.iter().enumerate() {
        let what = format!("operator {:?} (slot {slot})", op.name);
        if !names.insert(op.name.clone()) {
            return Err(format!("{what}: the name is already taken"));
        }
        if !is_ident(&op.name) {
            return Err(format!("{what}: the name must be snake_case"));
        }
        if !raw.args.contains_key(&op.args) {
            return Err(format!(
                "{what}: args {:?} has no [args.{}]",
                op.args, op.args
            ));
        }
        let index = match order.iter().position(|a| *a == op.args) {
            Some(i) => i,
            None => {
                order.push(op.args.clone());
                order.len() - 1
            }
        };
        let (dtypes, any_dtype) = match &op.dtypes {
            toml::Value::String(set) => {
                let list = sets
                    .get(set)
                    .cloned()
                    .or_else(|| DTYPES.contains(&set.as_str()).then(|| vec![set.clone()]))
                    .ok_or_else(|| format!("{what}: dtypes {set:?} is not a set of [dtypes]"))?;
                (list, set == "any")
            }
            toml::Value::Array(list) => {
                let list = list
                    .iter()
                    .map(|v| match v.as_str() {
                        Some(d) if DTYPES.contains(&d) => Ok(d.to_owned()),
                        _ => Err(format!("{what}: {v} is not a dtype")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                (list, false)
            }
            other => {
                return Err(format!(
                    "{what}: dtypes must be a set name or a list, not {other}"
                ));
            }
        };
        let mut retype = BTreeMap::new();
        for (field, dtype) in &op.retype {
            retype.insert(field.clone(), dtype_rule(dtype, &sets, &what)?);
        }
        let since = version(&op.since, &what)?;
        let mut dtypes = dtypes;
        let mut added = Vec::new();
        for (minor, list) in &op.added {
            let v = version(minor, &what)?;
            if v <= since {
                return Err(format!("{what}: added {minor:?} is not after its since"));
            }
            for d in list {
                if !DTYPES.contains(&d.as_str()) || dtypes.contains(d) {
                    return Err(format!("{what}: added {d:?} is not a new dtype"));
                }
                dtypes.push(d.clone());
                added.push((d.clone(), v));
            }
        }
        ops.push(Op {
            name: op.name.clone(),
            args: index,
            since,
            family: op.family.clone(),
            dtypes,
            any_dtype,
            doc: op.doc.clone(),
            retype,
            added,
        });
    }
    if let Some(unused) = raw.args.keys().find(|k| !order.contains(k)) {
        return Err(format!("[args.{unused}] is taken by no operator"));
    }
    check_append_only(&ops)?;
    let mut args = Vec::new();
    for (index, name) in order.iter().enumerate() {
        let users: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].args == index).collect();
        let since = users.iter().map(|&i| ops[i].since).min().expect("used");
        args.push(build_args(name, &raw.args[name], users, since, &sets)?);
    }
    let spec = Spec { ops, args };
    check_refs(&spec)?;
    Ok(spec)
}

fn dtype_sets(
    raw: &BTreeMap<String, Vec<String>>,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    for (name, list) in raw {
        if let Some(bad) = list.iter().find(|d| !DTYPES.contains(&d.as_str())) {
            return Err(format!("[dtypes] {name}: {bad:?} is not one of {DTYPES:?}"));
        }
        if DTYPES.contains(&name.as_str()) || name == "T" {
            return Err(format!(
                "[dtypes] {name}: a set may not be named like a dtype"
            ));
        }
    }
    Ok(raw.clone())
}

fn dtype_rule(
    text: &str,
    sets: &BTreeMap<String, Vec<String>>,
    what: &str,
) -> Result<DType, String> {
    if text == "T" {
        return Ok(DType::T);
    }
    if let Some(list) = sets.get(text) {
        return Ok(DType::OneOf(text.to_owned(), list.clone()));
    }
    if DTYPES.contains(&text) {
        return Ok(DType::OneOf(text.to_owned(), vec![text.to_owned()]));
    }
    Err(format!(
        "{what}: dtype {text:?} is not T, a dtype, or a set of [dtypes]"
    ))
}

/// Versions never go down along the table: a new operator goes at the end.
fn check_append_only(ops: &[Op]) -> Result<(), String> {
    for pair in ops.windows(2) {
        if pair[1].since < pair[0].since {
            return Err(format!(
                "operator {:?} (since {}.{}) comes after {:?} (since {}.{}): the op table is append-only, so a newer operator goes at the end",
                pair[1].name,
                pair[1].since.0,
                pair[1].since.1,
                pair[0].name,
                pair[0].since.0,
                pair[0].since.1
            ));
        }
    }
    Ok(())
}

fn build_args(
    name: &str,
    raw: &RawArgs,
    ops: Vec<usize>,
    since: (u32, u32),
    sets: &BTreeMap<String, Vec<String>>,
) -> Result<Args, String> {
    let mut fields = Vec::new();
    for f in &raw.fields {
        let what = format!("[args.{name}]");
        let tensor_keys = [
            (&f.input, Role::In),
            (&f.out, Role::Out),
            (&f.inout, Role::InOut),
        ];
        let scalar_keys = [
            (&f.f64, ScalarType::F64),
            (&f.i64, ScalarType::I64),
            (&f.i32, ScalarType::I32),
            (&f.flag, ScalarType::Flag),
        ];
        let tensors: Vec<_> = tensor_keys.iter().filter(|(n, _)| n.is_some()).collect();
        let scalars: Vec<_> = scalar_keys.iter().filter(|(n, _)| n.is_some()).collect();
        let field_name = match (tensors.as_slice(), scalars.as_slice()) {
            ([(n, _)], []) | ([], [(n, _)]) => n.as_ref().expect("filtered").clone(),
            _ => {
                return Err(format!(
                    "{what}: each field has exactly one of in, out, inout, f64, i64, i32, flag ({:?})",
                    f.doc
                ));
            }
        };
        let what = format!("[args.{name}] field {field_name:?}");
        if !is_ident(&field_name) || field_name == "struct_size" {
            return Err(format!("{what}: not a usable field name"));
        }
        let field_since = match &f.since {
            Some(s) => version(s, &what)?,
            None => since,
        };
        let kind = if let [(_, role)] = tensors.as_slice() {
            if f.default.is_some() || f.dim_of.is_some() {
                return Err(format!("{what}: default and dim_of are for scalars"));
            }
            let dtype = dtype_rule(
                f.dtype
                    .as_deref()
                    .ok_or_else(|| format!("{what}: a tensor needs a dtype"))?,
                sets,
                &what,
            )?;
            Kind::Tensor(Tensor {
                role: *role,
                dtype,
                layout: f.layout.as_deref().map(|l| layout(l, &what)).transpose()?,
                shape: f.shape.as_deref().map(|s| shape(s, &what)).transpose()?,
                alias: f.alias.clone(),
                optional: f.optional.clone(),
            })
        } else {
            let [(_, ty)] = scalars.as_slice() else {
                unreachable!()
            };
            if f.dtype.is_some()
                || f.layout.is_some()
                || f.shape.is_some()
                || !f.alias.is_empty()
                || f.optional.is_some()
            {
                return Err(format!(
                    "{what}: dtype, layout, shape, alias and optional are for tensors"
                ));
            }
            if f.dim_of.is_some() && *ty != ScalarType::I32 {
                return Err(format!("{what}: dim_of needs an i32 field"));
            }
            Kind::Scalar(Scalar {
                ty: *ty,
                default: f
                    .default
                    .as_ref()
                    .map(|d| default(d, *ty, &what))
                    .transpose()?,
                dim_of: f.dim_of.clone(),
            })
        };
        fields.push(Field {
            name: field_name,
            doc: f.doc.clone(),
            since: field_since,
            kind,
        });
    }
    let mut seen = BTreeSet::new();
    for f in &fields {
        if !seen.insert(&f.name) {
            return Err(format!("[args.{name}]: field {:?} appears twice", f.name));
        }
    }
    // Fields appended by a later minor come last and carry a default.
    for pair in fields.windows(2) {
        if pair[1].since < pair[0].since {
            return Err(format!(
                "[args.{name}]: field {:?} is older than {:?} before it; fields only append",
                pair[1].name, pair[0].name
            ));
        }
    }
    for f in fields.iter().filter(|f| f.since > since) {
        if f.tensor().is_some() || f.scalar().is_some_and(|s| s.default.is_none()) {
            return Err(format!(
                "[args.{name}]: field {:?} was appended in {}.{}, so it must be a scalar with a default (what a plugin assumes when struct_size does not reach it)",
                f.name, f.since.0, f.since.1
            ));
        }
    }
    if let Some(group) = &raw.group {
        if !is_ident(group) {
            return Err(format!("[args.{name}]: group {group:?} must be snake_case"));
        }
    }
    Ok(Args {
        name: name.to_owned(),
        doc: raw.doc.clone(),
        group: raw.group.clone(),
        rule: raw.rule.clone(),
        options: raw.options.clone(),
        fields,
        ops,
        since,
    })
}

fn layout(text: &str, what: &str) -> Result<Layout, String> {
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| format!("{what}: layout {text:?} is not [A, B, ...]"))?;
    let parts: Vec<&str> = inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let open = parts.first() == Some(&"...");
    if parts
        .iter()
        .skip(usize::from(open))
        .any(|p| *p == "..." || !is_ident(&p.to_ascii_lowercase()))
    {
        return Err(format!(
            "{what}: layout {text:?}: only a leading `...` and named dimensions"
        ));
    }
    Ok(Layout {
        text: text.to_owned(),
        dims: parts.len() - usize::from(open),
        open,
    })
}

fn shape(text: &str, what: &str) -> Result<Shape, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["like", x] => Ok(Shape::Like((*x).to_owned())),
        ["last", x] => Ok(Shape::Last((*x).to_owned())),
        ["rows", x] => Ok(Shape::Rows((*x).to_owned())),
        ["broadcasts", "to", x] => Ok(Shape::BroadcastsTo((*x).to_owned())),
        ["broadcast", rest @ ..] if rest.len() >= 2 => Ok(Shape::Broadcast(
            rest.iter().map(|&x| x.to_owned()).collect(),
        )),
        _ => Err(format!(
            "{what}: shape {text:?} is not `like x`, `last x`, `rows x`, `broadcast a b [c ...]` \
             or `broadcasts to x`"
        )),
    }
}

fn default(value: &toml::Value, ty: ScalarType, what: &str) -> Result<String, String> {
    match (ty, value) {
        (ScalarType::F64, toml::Value::Float(f)) => Ok(format!("{f:?}")),
        (ScalarType::F64, toml::Value::Integer(i)) => Ok(format!("{i}.0")),
        (ScalarType::I64 | ScalarType::I32, toml::Value::Integer(i)) => Ok(i.to_string()),
        (ScalarType::Flag, toml::Value::Boolean(b)) => Ok(b.to_string()),
        _ => Err(format!(
            "{what}: default {value} does not fit a {}",
            ty.safe()
        )),
    }
}

/// Every name a field or operator mentions exists and has the right kind.
fn check_refs(spec: &Spec) -> Result<(), String> {
    let op_names: BTreeSet<&str> = spec.ops.iter().map(|o| o.name.as_str()).collect();
    for args in &spec.args {
        let what = |f: &str| format!("[args.{}] field {f:?}", args.name);
        let tensor = |f: &Field, name: &str| -> Result<(), String> {
            match args.field(name) {
                Some(t) if t.tensor().is_some() => Ok(()),
                _ => Err(format!(
                    "{}: {name:?} is not a tensor of this struct",
                    what(&f.name)
                )),
            }
        };
        for f in &args.fields {
            if let Some(t) = f.tensor() {
                match &t.shape {
                    Some(
                        Shape::Like(x) | Shape::Last(x) | Shape::Rows(x) | Shape::BroadcastsTo(x),
                    ) => tensor(f, x)?,
                    Some(Shape::Broadcast(xs)) => {
                        for x in xs {
                            tensor(f, x)?;
                        }
                    }
                    None => {}
                }
                for a in &t.alias {
                    tensor(f, a)?;
                    if t.role == Role::In {
                        return Err(format!("{}: only outputs may alias", what(&f.name)));
                    }
                }
                if let Some(flag) = &t.optional {
                    match args.field(flag).and_then(Field::scalar) {
                        Some(s) if s.ty == ScalarType::Flag => {}
                        _ => {
                            return Err(format!(
                                "{}: optional {flag:?} is not a flag of this struct",
                                what(&f.name)
                            ));
                        }
                    }
                }
            }
            if let Some(s) = f.scalar() {
                if let Some(x) = &s.dim_of {
                    tensor(f, x)?;
                }
            }
        }
        // The first T tensor carries the operator's dtype; the others may
        // be given another by an operator's `retype`.
        let anchor = args
            .fields
            .iter()
            .find(|f| f.tensor().is_some_and(|t| t.dtype == DType::T));
        for &i in &args.ops {
            for field in spec.ops[i].retype.keys() {
                match args.field(field).and_then(Field::tensor) {
                    Some(t) if t.dtype == DType::T && anchor.map(|a| &a.name) != Some(field) => {}
                    _ => {
                        return Err(format!(
                            "operator {:?}: retype {field:?} is not a T tensor of [args.{}] after the first (which carries the operator's dtype)",
                            spec.ops[i].name, args.name
                        ));
                    }
                }
            }
        }
        if let Some(group) = &args.group {
            if op_names.contains(group.as_str()) {
                return Err(format!(
                    "[args.{}]: group {group:?} is also an operator's name",
                    args.name
                ));
            }
        }
        if args.options.is_some() && args.fields.iter().all(|f| f.scalar().is_none()) {
            return Err(format!("[args.{}]: options without scalars", args.name));
        }
    }
    Ok(())
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
