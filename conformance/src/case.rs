//! A conformance case: the tensors an operator call takes (with their
//! values, dtypes, shapes, memory layouts and roles), how to call the
//! plugin, how to compute the expected values with the reference, and the
//! tolerance.

use std::fmt;
use std::sync::Arc;

use polychip_host::{DType, Exec, Tensor};

use crate::reference::{Dense, RefError};
use crate::tolerance::Tolerance;

/// What the call does with a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read only: must come back unchanged.
    Input,
    /// Written: poisoned before the call, compared after it.
    Output,
    /// Read and written in place: starts with its values, compared after.
    InOut,
}

/// How a tensor is laid out in device memory. Every layout sits inside a
/// larger buffer, after and before guard zones (see [`crate::placement`]),
/// so every tensor also has a non-zero byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Compact row-major.
    Contiguous,
    /// The last two dimensions swapped in memory (a transposed view).
    Transposed,
    /// Every other element of the last dimension (stride 2, gaps between).
    Strided,
    /// Rows are slices of wider rows: the last dimension is compact, and the
    /// stride of every other dimension leaves a gap after each row.
    RowSlice,
    /// Stride 0 on this dimension: one stored slice read for every index
    /// (inputs only; the values are equal along the dimension).
    Broadcast(usize),
    /// A negative stride on this dimension: the slices are stored in reverse
    /// order and the view starts at the last one.
    Reversed(usize),
    /// The first two dimensions swapped in memory, the last one compact: a
    /// permuted view such as `[batch, heads, seq, d]` of a `[batch, seq,
    /// heads, d]` tensor, or `[seq, batch, h]` of `[batch, seq, h]`. With
    /// three dimensions or more its rows are not evenly spaced, so a kernel
    /// that walks `[..., H]` as `[rows, H]` with one row stride misreads it;
    /// with four or more its last two dimensions are compact, so one that
    /// judges a view compact by its inner dimensions misreads it too.
    Permuted,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Contiguous => f.write_str("contiguous"),
            Layout::Transposed => f.write_str("transposed"),
            Layout::Strided => f.write_str("strided"),
            Layout::RowSlice => f.write_str("row slice"),
            Layout::Broadcast(d) => write!(f, "broadcast along dim {d} (stride 0)"),
            Layout::Reversed(d) => write!(f, "reversed along dim {d} (negative stride)"),
            Layout::Permuted => f.write_str("permuted (dims 0 and 1 swapped in memory)"),
        }
    }
}

/// One tensor of a case.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    /// The argument's name in the op's args struct.
    pub name: &'static str,
    /// What the call does with it.
    pub role: Role,
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: Vec<usize>,
    /// Row-major values, already representable in `dtype` (ignored for
    /// outputs, which are poisoned).
    pub values: Vec<f64>,
    /// Memory layout.
    pub layout: Layout,
    /// For an output: the index (in the case's tensors) of the input it is
    /// exactly, so the call runs in place. The output is then not uploaded
    /// on its own: it is the input's view, and the input is not expected to
    /// come back unchanged.
    pub alias_of: Option<usize>,
    /// The tensor's exact elements where f64 values cannot carry them all,
    /// one i64 per element holding its bits (zero-extended below 8 bytes):
    /// i64s beyond 2^53, or floating NaNs whose payload and signalling bit
    /// matter (`values` then holds their nearest f64s, or NaN, which the
    /// reference sees). An input is uploaded from these, and an output must
    /// come back equal to them bit for bit, besides matching the reference.
    pub exact_bits: Option<Vec<i64>>,
}

impl TensorSpec {
    /// The element bytes uploaded for it, in row-major order: its exact
    /// i64 values where it has them, else its values in its dtype.
    pub fn bytes(&self) -> Vec<u8> {
        self.bytes_rotated(0)
    }

    /// [`Self::bytes`] of its values rotated left by `by` elements (other
    /// values, each of which the tensor can hold).
    pub fn bytes_rotated(&self, by: usize) -> Vec<u8> {
        // The values from `by` on, then those before it: no rotated copy.
        fn halves<T>(v: &[T], by: usize) -> [&[T]; 2] {
            let by = by.checked_rem(v.len()).unwrap_or(0);
            [&v[by..], &v[..by]]
        }
        let size = self.dtype.size();
        let mut out = Vec::with_capacity(self.values.len() * size);
        match &self.exact_bits {
            Some(exact) => {
                for &x in halves(exact, by).into_iter().flatten() {
                    push_element_bytes(&mut out, size, x);
                }
            }
            None => {
                for part in halves(&self.values, by) {
                    crate::values::to_bytes_into(self.dtype, part, &mut out);
                }
            }
        }
        out
    }

    /// The tensor as the reference sees it.
    pub fn dense(&self) -> Dense {
        Dense {
            shape: self.shape.clone(),
            data: self.values.clone(),
        }
    }
}

/// Appends the native-endian bytes of one element of `size` bytes whose
/// bits are the low bits of `bits`.
fn push_element_bytes(out: &mut Vec<u8>, size: usize, bits: i64) {
    match size {
        1 => out.push(bits as u8),
        2 => out.extend_from_slice(&(bits as u16).to_ne_bytes()),
        4 => out.extend_from_slice(&(bits as u32).to_ne_bytes()),
        _ => out.extend_from_slice(&bits.to_ne_bytes()),
    }
}

/// The bits of one element of `bytes.len()` bytes (native-endian),
/// zero-extended: the inverse of [`push_element_bytes`].
pub fn element_bits(bytes: &[u8]) -> i64 {
    match *bytes {
        [b] => i64::from(b),
        [a, b] => i64::from(u16::from_ne_bytes([a, b])),
        [a, b, c, d] => i64::from(u32::from_ne_bytes([a, b, c, d])),
        _ => i64::from_ne_bytes(bytes.try_into().expect("elements of 1, 2, 4 or 8 bytes")),
    }
}

/// Calls the plugin: the tensors arrive in the case's order.
pub type CallFn = Arc<dyn Fn(&Exec<'_>, &[Tensor]) -> polychip_host::Result<()> + Send + Sync>;
/// Computes the expected value of every `Output` and `InOut` tensor, in the
/// case's order, from all tensors' initial values; an error means the plugin
/// must refuse the call.
pub type RefFn = Arc<dyn Fn(&[Dense]) -> Result<Vec<Dense>, RefError> + Send + Sync>;

/// How to rebuild a case of a sized family at other sizes (for the shrinker).
#[derive(Clone, Debug)]
pub struct Resize {
    /// Builds the family's case for `(dtype, params)`.
    pub build: fn(DType, &[usize]) -> Case,
    /// This case's parameters (extents, in the family's order).
    pub params: Vec<usize>,
}

/// One call of one operator, with everything needed to run and judge it.
#[derive(Clone)]
pub struct Case {
    /// The operator, as named in the op table.
    pub op: &'static str,
    /// The dtype under test.
    pub dtype: DType,
    /// What this case exercises, e.g. `shape [3, 5] transposed` or `NaN and inf`.
    pub label: String,
    /// The tensors, in the order `call` takes them.
    pub tensors: Vec<TensorSpec>,
    /// The plugin call.
    pub call: CallFn,
    /// The reference.
    pub reference: RefFn,
    /// The error model.
    pub tolerance: Tolerance,
    /// For a case of a sized family: how to rebuild it smaller.
    pub resize: Option<Resize>,
    /// Whether the plugin is first called on the same buffers with other
    /// input values (each input's values rotated by one element), whose
    /// results are discarded, before the call that is judged: a result or
    /// a packed operand kept from an earlier call (a cache keyed by
    /// address) then shows.
    pub warm_up: bool,
    /// Whether the call is made on a stream of its own, behind another
    /// stream's work through an event, and how its completion is awaited
    /// (`None`: on the device's default stream). See [`StreamSync`].
    pub on_stream: Option<StreamSync>,
    /// Whether, once the call passes alone, it is also made from several
    /// threads at once, each with buffers and a stream of its own, for a
    /// few rounds (see `runner::concurrent_problem`): every result must
    /// still be right. The ABI makes every plugin function thread-safe;
    /// state a plugin shares between calls without a lock (a global
    /// scratch buffer, a cached handle or workspace) shows only this way.
    pub concurrent: bool,
    /// Whether the plugin is given the sparest descriptors the ABI allows
    /// (`polychip_host::Tensor::bare`): NULL `strides` for every compact
    /// tensor and NULL `data` for every empty one, as a framework passing
    /// its DLPack tensors through may give them.
    pub bare: bool,
    /// Whether the outputs hold a large finite value before the call
    /// ([`crate::values::FINITE_POISON_BYTE`]) rather than the NaN poison:
    /// a kernel that reads an output before writing it (a maximum taken
    /// with `fmax` into an output it never initialised, as an atomic-max
    /// kernel that counts on a memset does) ignores a NaN there and is
    /// right by accident, but not with a number.
    pub finite_poison: bool,
}

/// How a case run on a stream waits for its call's work before its outputs
/// are read on the default stream (which does not wait for other streams).
///
/// The inputs are first overwritten with other values; a second stream,
/// kept busy for a few milliseconds, then copies the right values back and
/// records an event; the call's stream waits for that event and runs the
/// call. A plugin whose wait, event, synchronisation or stream destruction
/// returns early, or whose operator ignores the stream it is given, then
/// reads the other values or leaves its outputs poisoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamSync {
    /// An event recorded after the call, then `event_synchronize`.
    Event,
    /// `stream_synchronize` on the call's stream.
    Stream,
    /// `stream_destroy` of the call's stream, which waits for its work.
    Destroy,
}

impl StreamSync {
    /// Every way, in the order the derived cases take them.
    pub const ALL: [StreamSync; 3] = [StreamSync::Event, StreamSync::Stream, StreamSync::Destroy];

    /// The plugin function that must wait.
    pub fn function(self) -> &'static str {
        match self {
            StreamSync::Event => "event_synchronize",
            StreamSync::Stream => "stream_synchronize",
            StreamSync::Destroy => "stream_destroy",
        }
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Case({} {} {})", self.op, self.dtype, self.label)
    }
}
