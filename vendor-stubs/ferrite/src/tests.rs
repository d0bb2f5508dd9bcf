//! Tests of the plugin through its [`Plugin`] methods (without a host): device
//! properties, copies, operators on the default stream and on streams, and
//! the memory checks in front of them.

use super::*;
use polychip_plugin_sdk::{DType, ErrorCode, TensorDesc};

fn plugin() -> Ferrite {
    Ferrite::with_config(Config {
        devices: 2,
        memory_bytes: 1 << 20,
        peak_flops: 200e9,
    })
}

fn default_queue(device: u32) -> Queue<'static, Stream> {
    Queue {
        device,
        stream: None,
    }
}

/// Allocates `n` f32 on `device` holding `values` (or zeros).
fn upload(p: &Ferrite, device: u32, values: &[f32]) -> *mut u8 {
    let ptr = p.alloc(device, (values.len() * 4) as u64).unwrap();
    // SAFETY: both ranges are `values.len() * 4` valid bytes.
    unsafe {
        p.memcpy(
            default_queue(device),
            CopyKind::HostToDevice,
            ptr,
            values.as_ptr().cast(),
            values.len() * 4,
        )
        .unwrap()
    };
    ptr
}

fn download(p: &Ferrite, device: u32, ptr: *const u8, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    // SAFETY: both ranges are `n * 4` valid bytes.
    unsafe {
        p.memcpy(
            default_queue(device),
            CopyKind::DeviceToHost,
            out.as_mut_ptr().cast(),
            ptr,
            n * 4,
        )
        .unwrap()
    };
    out
}

fn f32s<'a>(ptr: *mut u8, shape: &'a [i64]) -> TensorDesc<'a> {
    TensorDesc::new(ptr, DType::F32, shape, None)
}

#[test]
fn device_properties() {
    let p = plugin();
    assert_eq!(p.device_count(), 2);
    let props = p.device_props(1).unwrap();
    assert_eq!(props.name, "Ferrite F1");
    assert_eq!(props.memory_bytes, 1 << 20);
    assert!(props.host_visible && props.rdma_exportable);
    assert!(props.compute_units >= 1);
    assert_eq!(props.peak_flops_f32, 200e9);
    assert_eq!(props.peak_flops_bf16, 200e9);
    assert_eq!(props.peak_flops_f16, 200e9);
    assert_eq!(props.memory_bandwidth, 10e9);
    assert_eq!(props.link_bandwidth, 10e9);
    assert_eq!(Ferrite::VENDOR, c"Ferrite");
    assert_eq!(Ferrite::VERSION, c"1.0.0");
}

#[test]
fn memcpy_round_trip_and_range_checks() {
    let p = plugin();
    let a = upload(&p, 0, &[1.0, 2.0, 3.0, 4.0]);
    let b = p.alloc(0, 16).unwrap();
    // SAFETY: both are live 16-byte allocations.
    unsafe {
        p.memcpy(default_queue(0), CopyKind::DeviceToDevice, b, a, 16)
            .unwrap()
    };
    assert_eq!(download(&p, 0, b, 4), [1.0, 2.0, 3.0, 4.0]);

    let mut host = [0u8; 32];
    // SAFETY: every call below is rejected before any byte moves.
    unsafe {
        let err = p
            .memcpy(
                default_queue(0),
                CopyKind::DeviceToHost,
                host.as_mut_ptr(),
                a,
                17,
            )
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(
            err.message.starts_with("memcpy_d2h: src"),
            "{}",
            err.message
        );
        let err = p
            .memcpy(
                default_queue(1),
                CopyKind::HostToDevice,
                a,
                host.as_ptr(),
                4,
            )
            .unwrap_err();
        assert!(err.message.contains("device 1"), "{}", err.message);
        let err = p
            .memcpy(default_queue(0), CopyKind::DeviceToDevice, a.add(4), a, 8)
            .unwrap_err();
        assert!(err.message.contains("overlap"), "{}", err.message);
    }
    // SAFETY: both came from `alloc` on device 0 and no work uses them.
    unsafe {
        p.free(0, a).unwrap();
        p.free(0, b).unwrap();
        assert_eq!(p.free(0, b).unwrap_err().code, ErrorCode::InvalidArgument);
    }
}

#[test]
fn operators_on_the_default_stream() {
    let p = plugin();
    let shape = [2i64, 3];
    let a = upload(&p, 0, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = upload(&p, 0, &[10.0, 20.0, 30.0]);
    let out = p.alloc(0, 24).unwrap();
    let q = default_queue(0);
    // SAFETY: every tensor lies in a live allocation of device 0.
    unsafe {
        p.fill(
            q,
            &FillArgs {
                out: f32s(out, &shape),
                value: 0.5,
            },
        )
        .unwrap();
        assert_eq!(download(&p, 0, out, 6), [0.5; 6]);

        // Broadcast b over the rows: out = a + 2 * b.
        p.binary(
            q,
            BinaryOp::Add,
            &BinaryArgs {
                a: f32s(a, &shape),
                b: f32s(b, &[3]),
                out: f32s(out, &shape),
                alpha: 2.0,
            },
        )
        .unwrap();
        assert_eq!(
            download(&p, 0, out, 6),
            [21.0, 42.0, 63.0, 24.0, 45.0, 66.0]
        );

        // In place: a = a * a.
        p.binary(
            q,
            BinaryOp::Mul,
            &BinaryArgs {
                a: f32s(a, &shape),
                b: f32s(a, &shape),
                out: f32s(a, &shape),
                alpha: 1.0,
            },
        )
        .unwrap();
        assert_eq!(download(&p, 0, a, 6), [1.0, 4.0, 9.0, 16.0, 25.0, 36.0]);

        // [2, 3] @ [3, 1] with b as a column.
        let col = [3i64, 1];
        let mm = p.alloc(0, 8).unwrap();
        p.matmul(
            q,
            &MatmulArgs {
                a: f32s(a, &shape),
                b: f32s(b, &col),
                out: f32s(mm, &[2, 1]),
                alpha: 1.0,
                beta: 0.0,
                transpose_a: false,
                transpose_b: false,
            },
        )
        .unwrap();
        assert_eq!(download(&p, 0, mm, 2), [360.0, 1740.0]);

        p.softmax(
            q,
            &SoftmaxArgs {
                input: f32s(b, &[3]),
                out: f32s(b, &[3]),
            },
        )
        .unwrap();
        let s = download(&p, 0, b, 3);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{s:?}");
        assert!(s[2] > 0.99);

        // Transposing copy through strides, then a cast to f64.
        let t = p.alloc(0, 24).unwrap();
        let strides = [1i64, 3];
        p.copy(
            q,
            &CopyArgs {
                src: TensorDesc::new(a, DType::F32, &[3, 2], Some(&strides)),
                dst: f32s(t, &[3, 2]),
            },
        )
        .unwrap();
        assert_eq!(download(&p, 0, t, 6), [1.0, 16.0, 4.0, 25.0, 9.0, 36.0]);
        let d = p.alloc(0, 48).unwrap();
        p.cast(
            q,
            &CastArgs {
                src: f32s(t, &[3, 2]),
                dst: TensorDesc::new(d, DType::F64, &[3, 2], None),
            },
        )
        .unwrap();
        let mut back = [0f64; 6];
        p.memcpy(q, CopyKind::DeviceToHost, back.as_mut_ptr().cast(), d, 48)
            .unwrap();
        assert_eq!(back, [1.0, 16.0, 4.0, 25.0, 9.0, 36.0]);
    }
}

#[test]
fn operands_must_lie_in_live_memory_of_the_device() {
    let p = plugin();
    let a = p.alloc(0, 16).unwrap();
    let other = p.alloc(1, 64).unwrap();
    let mut host = [0f32; 4];
    let q = default_queue(0);
    let fill = |out: TensorDesc<'_>| {
        // SAFETY: `launch` rejects every call below before any kernel runs.
        unsafe { p.fill(q, &FillArgs { out, value: 1.0 }) }.unwrap_err()
    };
    let err = fill(f32s(a, &[5]));
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert!(err.message.starts_with("fill: out"), "{}", err.message);
    assert!(err.message.contains("device 0"), "{}", err.message);
    fill(f32s(host.as_mut_ptr().cast(), &[4]));
    fill(f32s(other, &[4]));
    let back = [-1i64];
    fill(TensorDesc::new(a, DType::F32, &[2], Some(&back)));
    let huge = [i64::MAX, i64::MAX];
    let err = fill(TensorDesc::new(a, DType::F32, &huge, Some(&huge)));
    assert!(
        err.message.contains("outside the address space"),
        "{}",
        err.message
    );
    let err = fill(TensorDesc::new(
        a,
        DType::F32,
        &[2, 2],
        Some(&[-1, i64::MAX]),
    ));
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    // Empty tensors touch nothing, wherever they point.
    // SAFETY: no element is addressed.
    unsafe {
        p.fill(
            q,
            &FillArgs {
                out: f32s(std::ptr::null_mut(), &[0, 3]),
                value: 1.0,
            },
        )
        .unwrap();
    }

    // A partial overlap of dense tensors is refused; exact aliasing is not.
    let big = p.alloc(0, 64).unwrap();
    // SAFETY: rejected before running.
    let err = unsafe {
        p.binary(
            q,
            BinaryOp::Add,
            &BinaryArgs {
                a: f32s(big, &[8]),
                b: f32s(big, &[8]),
                out: f32s(big.add(4), &[8]),
                alpha: 1.0,
            },
        )
    }
    .unwrap_err();
    assert!(
        err.message.starts_with("add: out partly overlaps a"),
        "{}",
        err.message
    );
}

#[test]
fn kernel_errors_name_the_operator() {
    let p = plugin();
    let a = p.alloc(0, 64).unwrap();
    // A misaligned f32 tensor: in live memory, refused by the kernel.
    // SAFETY: the kernel refuses it before touching memory.
    let err = unsafe {
        p.fill(
            default_queue(0),
            &FillArgs {
                out: f32s(a.add(1), &[2]),
                value: 1.0,
            },
        )
    }
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert!(err.message.starts_with("fill: "), "{}", err.message);
    assert!(!err.message.starts_with("fill: fill:"), "{}", err.message);
}

#[test]
fn operators_on_streams_with_events() {
    let p = plugin();
    let n = 1 << 14;
    let shape = [n as i64];
    let x = p.alloc(0, (n * 4) as u64).unwrap();
    let y = p.alloc(0, (n * 4) as u64).unwrap();
    let s1 = p.stream_create(0).unwrap();
    let s2 = p.stream_create(0).unwrap();
    let e = p.event_create(0).unwrap();
    let q1 = Queue {
        device: 0,
        stream: Some(&s1),
    };
    let q2 = Queue {
        device: 0,
        stream: Some(&s2),
    };
    // SAFETY: x and y are live allocations of device 0 until the end.
    unsafe {
        for i in 0..10 {
            p.fill(
                q1,
                &FillArgs {
                    out: f32s(x, &shape),
                    value: f64::from(i),
                },
            )
            .unwrap();
        }
        p.event_record(&e, q1).unwrap();
        p.stream_wait_event(q2, &e).unwrap();
        // y = x + x on stream 2, after stream 1's last fill (x = 9).
        p.binary(
            q2,
            BinaryOp::Add,
            &BinaryArgs {
                a: f32s(x, &shape),
                b: f32s(x, &shape),
                out: f32s(y, &shape),
                alpha: 1.0,
            },
        )
        .unwrap();
    }
    p.stream_synchronize(&s2).unwrap();
    assert!(download(&p, 0, y, n).iter().all(|&v| v == 18.0));
    p.event_synchronize(&e).unwrap();

    // A failing operator on a stream reports at synchronize, naming the op;
    // the work queued after it is skipped.
    // SAFETY: as above; the misaligned fill is refused by its kernel.
    unsafe {
        p.fill(
            q1,
            &FillArgs {
                out: f32s(x.add(2), &[4]),
                value: 1.0,
            },
        )
        .unwrap();
        p.fill(
            q1,
            &FillArgs {
                out: f32s(y, &shape),
                value: 3.0,
            },
        )
        .unwrap();
    }
    let err = p.stream_synchronize(&s1).unwrap_err();
    assert!(err.message.starts_with("fill: "), "{}", err.message);
    assert!(
        err.message.contains("1 later operation(s)"),
        "{}",
        err.message
    );
    assert_eq!(download(&p, 0, y, 1), [18.0]);
    p.stream_synchronize(&s1).unwrap();
    drop((s1, s2));
}
