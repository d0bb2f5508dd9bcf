//! "Planted": a test-only plugin whose bugs are planted on purpose, so that
//! tests can prove the host and the conformance suite catch them. One device
//! of ordinary host memory, synchronous streams.
//!
//! Planted bugs: `matmul` panics (the SDK must turn it into an error object
//! and the host must keep working); `fill` is correct.

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::Mutex;

use polychip_plugin_sdk::{
    CopyKind, DType, DeviceProps, Error, FillArgs, Host, MatmulArgs, Plugin, Queue, Result,
};

/// The plugin's state: live allocations and their sizes.
#[derive(Debug, Default)]
pub struct Planted {
    allocations: Mutex<HashMap<usize, Layout>>,
}

const CAPACITY: u64 = 64 << 20;

impl Plugin for Planted {
    type Stream = ();
    type Event = ();
    const VENDOR: &'static std::ffi::CStr = c"Planted";
    const VERSION: &'static std::ffi::CStr = c"0.1.0";

    fn new(_host: &Host) -> Result<Self> {
        Ok(Planted::default())
    }

    fn device_count(&self) -> u32 {
        1
    }

    fn device_props(&self, _device: u32) -> Result<DeviceProps> {
        Ok(DeviceProps {
            name: "Planted P0".into(),
            memory_bytes: CAPACITY,
            host_visible: true,
            ..DeviceProps::default()
        })
    }

    fn alloc(&self, _device: u32, bytes: u64) -> Result<*mut u8> {
        if bytes > CAPACITY {
            return Err(Error::out_of_memory(format!(
                "planted: {bytes} bytes exceed {CAPACITY}"
            )));
        }
        let layout = Layout::from_size_align(bytes as usize, 64)
            .map_err(|e| Error::invalid(e.to_string()))?;
        // SAFETY: the layout has a non-zero size (the SDK never asks for 0 bytes).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(Error::out_of_memory("planted: the system allocator failed"));
        }
        self.allocations
            .lock()
            .unwrap()
            .insert(ptr as usize, layout);
        Ok(ptr)
    }

    unsafe fn free(&self, _device: u32, ptr: *mut u8) -> Result<()> {
        let layout = self
            .allocations
            .lock()
            .unwrap()
            .remove(&(ptr as usize))
            .ok_or_else(|| Error::invalid("planted: free of an unknown pointer"))?;
        // SAFETY: the pointer was allocated with this layout and is freed once.
        unsafe { std::alloc::dealloc(ptr, layout) };
        Ok(())
    }

    unsafe fn memcpy(
        &self,
        _q: Queue<'_, ()>,
        _kind: CopyKind,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
    ) -> Result<()> {
        // SAFETY: the caller guarantees both ranges (all memory here is host memory).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        Ok(())
    }

    fn stream_create(&self, _device: u32) -> Result<()> {
        Ok(())
    }
    fn stream_synchronize(&self, _stream: &()) -> Result<()> {
        Ok(())
    }
    fn event_create(&self, _device: u32) -> Result<()> {
        Ok(())
    }
    fn event_record(&self, _event: &(), _q: Queue<'_, ()>) -> Result<()> {
        Ok(())
    }
    fn stream_wait_event(&self, _q: Queue<'_, ()>, _event: &()) -> Result<()> {
        Ok(())
    }
    fn event_synchronize(&self, _event: &()) -> Result<()> {
        Ok(())
    }

    unsafe fn fill(&self, _q: Queue<'_, ()>, args: &FillArgs<'_>) -> Result<()> {
        if args.out.dtype != DType::F32 || !args.out.is_contiguous() {
            return Err(Error::unimplemented(
                "planted: fill supports compact f32 only",
            ));
        }
        let n = args.out.numel();
        // SAFETY: the host passes a live, compact f32 tensor of n elements.
        let out = unsafe { std::slice::from_raw_parts_mut(args.out.data.cast::<f32>(), n) };
        out.fill(args.value as f32);
        Ok(())
    }

    unsafe fn matmul(&self, _q: Queue<'_, ()>, args: &MatmulArgs<'_>) -> Result<()> {
        panic!("planted bug: matmul panics on shape {:?}", args.a.shape);
    }
}

polychip_plugin_sdk::export_plugin!(Planted, ops: [fill, matmul]);
