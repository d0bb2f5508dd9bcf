//! Contract bugs that the SDK would never let an `Operators` method commit:
//! raw `extern "C"` op-table entries, patched into the table after the SDK's
//! shims fill it (see `crate::set_ops`). Each wraps the SDK's own entry for
//! its operator, so argument checking and the kernel are the real ones, and
//! then breaks one rule of the error-object contract or of the arguments.

use std::ffi::c_char;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use polychip_plugin_sdk::__export::generated;
use polychip_plugin_sdk::abi::{
    self, PolychipAdamwArgs, PolychipBinaryArgs, PolychipCrossEntropyBackwardArgs,
    PolychipEmbeddingBackwardArgs, PolychipError, PolychipHostApi, PolychipOpTable,
    PolychipReduceArgs, PolychipRopeArgs, PolychipStream, PolychipTensor,
};

use super::{Bug, is};
use crate::Planted;

/// The host's table, kept by the entry point (the ABI says it lives for the
/// whole process), so raw entries can make and destroy error objects.
pub static HOST: AtomicPtr<PolychipHostApi> = AtomicPtr::new(null_mut());

/// Makes an error object through the host's `error_new`.
fn error_new(code: abi::PolychipErrorCode, message: &str) -> *mut PolychipError {
    let host = HOST.load(Ordering::Acquire);
    // SAFETY: set once by the entry point to the host's live table.
    match unsafe { host.as_ref() }.and_then(|h| h.error_new.map(|f| (h.context, f))) {
        // SAFETY: a thread-safe host callback borrowing `message` for the call.
        Some((ctx, new)) => unsafe {
            new(ctx, code, message.as_ptr().cast::<c_char>(), message.len())
        },
        None => null_mut(),
    }
}

/// Destroys an error object through the host's `error_destroy`.
fn error_destroy(error: *mut PolychipError) {
    let host = HOST.load(Ordering::Acquire);
    // SAFETY: set once by the entry point to the host's live table.
    let table = unsafe { host.as_ref() };
    if let Some((ctx, destroy)) = table.and_then(|h| h.error_destroy.map(|f| (h.context, f))) {
        // SAFETY: a thread-safe host callback; the object is ours to destroy.
        unsafe { destroy(ctx, error) };
    }
}

/// Replaces the entries of the selected contract bug.
pub fn patch(table: &mut PolychipOpTable) {
    if is(Bug::SubIgnoresByteOffset) {
        table.sub = Some(sub_ignores_byte_offset);
    }
    if is(Bug::AdamwRefusalWrongCode) {
        table.adamw = Some(adamw_wrong_code);
    }
    if is(Bug::EmbeddingBackwardForeignError) {
        table.embedding_backward = Some(embedding_backward_foreign);
    }
    if is(Bug::CrossEntropyBackwardStaleError) {
        table.cross_entropy_backward = Some(cross_entropy_backward_stale);
    }
    if is(Bug::RopeBackwardNoWrite) {
        table.rope_backward = Some(rope_backward_no_write);
    }
    if is(Bug::MulNullStridesRefused) {
        table.mul = Some(mul_null_strides_refused);
    }
    if is(Bug::SumNullDataRefused) {
        table.sum = Some(sum_null_data_refused);
    }
}

/// Copies an args struct (the part this plugin knows) so it can be edited.
///
/// # Safety
/// `args` is NULL or a readable struct of at least `size_of::<T>()` bytes.
unsafe fn copy_of<T: Copy>(args: *const T) -> Option<T> {
    // SAFETY: guaranteed by the caller (the SDK re-checks struct_size).
    unsafe { args.as_ref().copied() }
}

unsafe extern "C" fn sub_ignores_byte_offset(
    device: u32,
    stream: *mut PolychipStream,
    args: *const PolychipBinaryArgs,
) -> *mut PolychipError {
    // SAFETY: the host keeps the operator contract.
    let Some(mut copy) = (unsafe { copy_of(args) }) else {
        // SAFETY: forwarded contract.
        return unsafe { generated::sub::<Planted>(device, stream, args) };
    };
    // Planted: `a` read from its buffer's start.
    copy.struct_size = size_of::<PolychipBinaryArgs>();
    copy.a.byte_offset = 0;
    // SAFETY: the same call with one offset dropped (still inside `a`'s buffer).
    unsafe { generated::sub::<Planted>(device, stream, &copy) }
}

unsafe extern "C" fn adamw_wrong_code(
    device: u32,
    stream: *mut PolychipStream,
    args: *const PolychipAdamwArgs,
) -> *mut PolychipError {
    // SAFETY: forwarded contract.
    let e = unsafe { generated::adamw::<Planted>(device, stream, args) };
    if e.is_null() {
        return e;
    }
    // Planted: the SDK's refusal rewritten with the wrong code.
    error_destroy(e);
    error_new(abi::POLYCHIP_ERROR_INTERNAL, "planted: adamw failed")
}

/// A static error "object" the host never made.
static FOREIGN: [u64; 4] = [0xdead_beef; 4];

unsafe extern "C" fn embedding_backward_foreign(
    device: u32,
    stream: *mut PolychipStream,
    args: *const PolychipEmbeddingBackwardArgs,
) -> *mut PolychipError {
    // SAFETY: forwarded contract.
    let e = unsafe { generated::embedding_backward::<Planted>(device, stream, args) };
    if e.is_null() {
        return e;
    }
    // Planted: a refusal returned as a pointer to the plugin's own static.
    error_destroy(e);
    FOREIGN.as_ptr().cast::<PolychipError>().cast_mut()
}

static LAST_ERROR: AtomicPtr<PolychipError> = AtomicPtr::new(null_mut());

unsafe extern "C" fn cross_entropy_backward_stale(
    device: u32,
    stream: *mut PolychipStream,
    args: *const PolychipCrossEntropyBackwardArgs,
) -> *mut PolychipError {
    // SAFETY: forwarded contract.
    let e = unsafe { generated::cross_entropy_backward::<Planted>(device, stream, args) };
    if !e.is_null() {
        // Planted: the "last error" is remembered after being handed over...
        LAST_ERROR.store(e, Ordering::Release);
        return e;
    }
    // ...and handed over again by the next call.
    LAST_ERROR.swap(null_mut(), Ordering::AcqRel)
}

unsafe extern "C" fn rope_backward_no_write(
    _device: u32,
    _stream: *mut PolychipStream,
    _args: *const PolychipRopeArgs,
) -> *mut PolychipError {
    // Planted: success, and nothing launched.
    null_mut()
}

unsafe extern "C" fn mul_null_strides_refused(
    device: u32,
    stream: *mut PolychipStream,
    args: *const PolychipBinaryArgs,
) -> *mut PolychipError {
    // SAFETY: the host keeps the operator contract.
    if let Some(a) = unsafe { copy_of(args) } {
        let null = |t: &PolychipTensor| t.ndim > 0 && t.strides.is_null();
        if null(&a.a) || null(&a.b) || null(&a.out) {
            // Planted: NULL strides (compact) taken for a missing argument.
            return error_new(
                abi::POLYCHIP_ERROR_INVALID_ARGUMENT,
                "planted: mul: a tensor has NULL strides",
            );
        }
    }
    // SAFETY: forwarded contract.
    unsafe { generated::mul::<Planted>(device, stream, args) }
}

unsafe extern "C" fn sum_null_data_refused(
    device: u32,
    stream: *mut PolychipStream,
    args: *const PolychipReduceArgs,
) -> *mut PolychipError {
    // SAFETY: the host keeps the operator contract.
    if let Some(a) = unsafe { copy_of(args) }
        && (a.input.data.is_null() || a.out.data.is_null())
    {
        // Planted: NULL data refused before the extents are looked at.
        return error_new(
            abi::POLYCHIP_ERROR_INVALID_ARGUMENT,
            "planted: sum: a tensor has NULL data",
        );
    }
    // SAFETY: forwarded contract.
    unsafe { generated::sum::<Planted>(device, stream, args) }
}
