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

/// How a tensor is laid out in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Compact row-major.
    Contiguous,
    /// The last two dimensions swapped in memory (a transposed view).
    Transposed,
    /// Every other element of the last dimension (stride 2, gaps between).
    Strided,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Contiguous => "contiguous",
            Layout::Transposed => "transposed",
            Layout::Strided => "strided",
        })
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
}

impl TensorSpec {
    /// The tensor as the reference sees it.
    pub fn dense(&self) -> Dense {
        Dense {
            shape: self.shape.clone(),
            data: self.values.clone(),
        }
    }
}

/// Calls the plugin: the tensors arrive in the case's order.
pub type CallFn = Arc<dyn Fn(&Exec<'_>, &[Tensor]) -> polychip_host::Result<()> + Send + Sync>;
/// Computes the expected value of every `Output` and `InOut` tensor, in the
/// case's order, from all tensors' initial values; an error means the plugin
/// must refuse the call.
pub type RefFn = Arc<dyn Fn(&[Dense]) -> Result<Vec<Dense>, RefError> + Send + Sync>;

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
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Case({} {} {})", self.op, self.dtype, self.label)
    }
}
