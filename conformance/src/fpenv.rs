//! Whether a call left a stream's thread with another floating-point
//! environment (ABI rule 12).
//!
//! The host sees a change on the thread that calls the plugin, and puts it
//! back ([`polychip_host::ffi::fpenv`]); a plugin that runs a stream's work
//! on a thread of its own can change that thread's environment where the
//! host cannot look, and every later operator on the stream then flushes
//! subnormals or rounds the other way. So after a stream case, one small
//! f32 `add` is queued on the same stream whose six sums tell each mode
//! apart: ties and one-and-a-half-ULP sums (the rounding mode), a subnormal
//! input (denormals-are-zero) and a subnormal result (flush-to-zero). A
//! difference counts only when the same `add` on a fresh stream is right
//! (a plugin whose `add` is simply wrong fails `add`'s own cases).

use polychip_host::{DType, Device, Stream};

/// `(a, b)` pairs of the probe, and what each row shows when it is wrong.
fn probe() -> [(f32, f32, &'static str); 6] {
    let half_ulp = 2f32.powi(-24);
    [
        (1.0, half_ulp, "rounding"),
        (-1.0, -half_ulp, "rounding"),
        (1.0, 3.0 * half_ulp, "rounding"),
        (-1.0, -3.0 * half_ulp, "rounding"),
        // The smallest subnormal plus zero: zero when inputs are read as 0.
        (f32::from_bits(1), 0.0, "daz"),
        // The smallest normal less half of it: a subnormal result.
        (f32::MIN_POSITIVE, -f32::MIN_POSITIVE / 2.0, "ftz"),
    ]
}

/// The probe's sums on `stream`, or `None` when the plugin could not run it.
fn sums(device: &Device, stream: &Stream) -> Option<Vec<u32>> {
    let rows = probe();
    let n = rows.len() as i64;
    let bytes = |pick: fn(&(f32, f32, &str)) -> f32| -> Vec<u8> {
        rows.iter().flat_map(|r| pick(r).to_le_bytes()).collect()
    };
    let a = device.empty(DType::F32, &[n]).ok()?;
    let b = device.empty(DType::F32, &[n]).ok()?;
    let out = device.empty(DType::F32, &[n]).ok()?;
    a.write_bytes(&bytes(|r| r.0)).ok()?;
    b.write_bytes(&bytes(|r| r.1)).ok()?;
    stream.exec().add(&a, &b, &out, 1.0).ok()?;
    stream.synchronize().ok()?;
    let got = out.read_bytes().ok()?;
    Some(
        got.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// What is wrong with `got`, in words, or `None` when every sum is the
/// round-to-nearest-even, subnormal-keeping one.
fn judge(got: &[u32]) -> Option<String> {
    let mut wrong = Vec::new();
    for ((a, b, class), bits) in probe().iter().zip(got) {
        if (a + b).to_bits() != *bits && !wrong.contains(class) {
            wrong.push(*class);
        }
    }
    if wrong.is_empty() {
        return None;
    }
    let words: Vec<&str> = wrong
        .iter()
        .map(|class| match *class {
            "rounding" => "rounded other than to nearest even",
            "daz" => "read a subnormal input as zero (denormals-are-zero)",
            _ => "flushed a subnormal result to zero (flush-to-zero)",
        })
        .collect();
    Some(words.join(", and "))
}

/// After a call on `stream` (awaited), whether an `add` queued behind it
/// shows the stream's thread left with another floating-point environment.
pub fn left_changed(device: &Device, stream: &Stream) -> Option<String> {
    let what = judge(&sums(device, stream)?)?;
    let fresh = device.stream().ok()?;
    if judge(&sums(device, &fresh)?).is_some() {
        return None;
    }
    Some(format!(
        "an f32 add queued on the same stream after this call {what}, which the same add on a \
         fresh stream does not: the call left the floating-point environment of the thread that \
         runs the stream's work changed (ABI rule 12: restore rounding mode, FTZ/DAZ and \
         exception masks before returning)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn right_sums_pass_and_each_mode_is_named() {
        let right: Vec<u32> = probe().iter().map(|(a, b, _)| (a + b).to_bits()).collect();
        assert_eq!(judge(&right), None);
        let mut ftz = right.clone();
        ftz[5] = 0;
        assert!(judge(&ftz).unwrap().contains("flush-to-zero"));
        let mut daz = right.clone();
        daz[4] = 0;
        assert!(judge(&daz).unwrap().contains("denormals-are-zero"));
        let mut upward = right;
        upward[0] = (1.0f32 + f32::EPSILON).to_bits();
        assert!(judge(&upward).unwrap().contains("nearest even"));
        // The probe's rows do tell the modes apart: a tie and a 1.5-ULP sum.
        assert_eq!(1.0f32 + 2f32.powi(-24), 1.0);
        assert_eq!(1.0f32 + 3.0 * 2f32.powi(-24), 1.0 + 2.0 * f32::EPSILON);
        assert!((f32::MIN_POSITIVE / 2.0).is_subnormal());
    }
}
