//! The calling thread's floating-point environment around every call into a
//! plugin.
//!
//! A kernel that turns on flush-to-zero or denormals-are-zero for speed, or
//! changes the rounding mode or the exception masks, and returns without
//! restoring them changes every later floating-point operation on that
//! thread: the framework's own CPU math, other vendors' calls, the
//! conformance suite's reference. (A shared library built with
//! `-ffast-math` by an older GCC does it from a constructor when it is
//! loaded.) The ABI's rule 12 forbids it; the host reads the environment's
//! control bits before and after each call (two register reads), and when
//! they differ it restores them, counts the call on the plugin, warns once
//! per plugin and function, and leaves a record for the calling thread that
//! `polychip conform` turns into a failed case ([`take_change`]).
//!
//! Only control bits are compared: the sticky exception flags (MXCSR's low
//! six bits, FPSR) legitimately change with every inexact result.

use std::cell::RefCell;

/// The control bits of the calling thread's floating-point environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpEnv {
    /// x86-64: MXCSR without its exception flags. AArch64: FPCR.
    control: u64,
    /// x86-64: the x87 control word (rounding and precision of `long
    /// double` math). Zero elsewhere.
    x87: u16,
}

#[cfg(target_arch = "x86_64")]
mod arch {
    /// MXCSR's sticky exception flags (IE, DE, ZE, OE, UE, PE).
    const FLAGS: u32 = 0x3f;
    /// The x87 control word's defined bits (masks, precision, rounding).
    const X87_BITS: u16 = 0x0f3f;

    #[inline(always)]
    pub fn read() -> (u64, u16) {
        let mut mxcsr: u32 = 0;
        let mut cw: u16 = 0;
        // SAFETY: stmxcsr and fnstcw store 4 and 2 bytes to the given,
        // writable locations and change nothing else.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &raw mut mxcsr, options(nostack, preserves_flags));
            std::arch::asm!("fnstcw [{}]", in(reg) &raw mut cw, options(nostack, preserves_flags));
        }
        (u64::from(mxcsr & !FLAGS), cw & X87_BITS)
    }

    pub fn write(control: u64, x87: u16) {
        let mut mxcsr: u32 = 0;
        // SAFETY: as in `read`; ldmxcsr is given the current flags with
        // control bits read earlier from this register (so no reserved
        // bit is set), fldcw a control word read earlier with fnstcw.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &raw mut mxcsr, options(nostack, preserves_flags));
            let value = (mxcsr & FLAGS) | control as u32;
            std::arch::asm!("ldmxcsr [{}]", in(reg) &raw const value, options(nostack, preserves_flags));
            let mut cw: u16 = 0;
            std::arch::asm!("fnstcw [{}]", in(reg) &raw mut cw, options(nostack, preserves_flags));
            let cw = (cw & !X87_BITS) | x87;
            std::arch::asm!("fldcw [{}]", in(reg) &raw const cw, options(nostack, preserves_flags));
        }
    }

    /// What changed between two control values, in words.
    pub fn describe(before: (u64, u16), after: (u64, u16)) -> Vec<String> {
        let (b, a) = (before.0 as u32, after.0 as u32);
        let mut out = Vec::new();
        let bit = |mask: u32, name: &str, out: &mut Vec<String>| {
            if b & mask != a & mask {
                let state = if a & mask != 0 { "on" } else { "off" };
                out.push(format!("{name} turned {state}"));
            }
        };
        bit(1 << 15, "flush-to-zero (MXCSR.FZ)", &mut out);
        bit(1 << 6, "denormals-are-zero (MXCSR.DAZ)", &mut out);
        let rounding = |v: u32| match (v >> 13) & 3 {
            0 => "to nearest",
            1 => "downward",
            2 => "upward",
            _ => "toward zero",
        };
        if (b >> 13) & 3 != (a >> 13) & 3 {
            out.push(format!(
                "the rounding mode changed from {} to {}",
                rounding(b),
                rounding(a)
            ));
        }
        let names = [
            "invalid",
            "denormal",
            "divide-by-zero",
            "overflow",
            "underflow",
            "inexact",
        ];
        let unmasked: Vec<&str> = (0..6)
            .filter(|i| b & (1 << (7 + i)) != 0 && a & (1 << (7 + i)) == 0)
            .map(|i| names[i])
            .collect();
        if !unmasked.is_empty() {
            out.push(format!(
                "floating-point exceptions unmasked (they trap: SIGFPE): {}",
                unmasked.join(", ")
            ));
        }
        let masked = (0..6).any(|i| b & (1 << (7 + i)) == 0 && a & (1 << (7 + i)) != 0);
        if masked {
            out.push("floating-point exception masks changed".into());
        }
        if out.is_empty() && b != a {
            out.push(format!(
                "MXCSR's control bits changed from {b:#06x} to {a:#06x}"
            ));
        }
        if before.1 != after.1 {
            out.push(format!(
                "the x87 control word changed from {:#06x} to {:#06x}",
                before.1, after.1
            ));
        }
        out
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    pub fn read() -> (u64, u16) {
        let fpcr: u64;
        // SAFETY: reading FPCR has no side effect.
        unsafe {
            std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack, preserves_flags))
        };
        (fpcr, 0)
    }

    pub fn write(control: u64, _x87: u16) {
        // SAFETY: writes back a value read from FPCR earlier.
        unsafe {
            std::arch::asm!("msr fpcr, {}", in(reg) control, options(nomem, nostack, preserves_flags))
        };
    }

    pub fn describe(before: (u64, u16), after: (u64, u16)) -> Vec<String> {
        let (b, a) = (before.0, after.0);
        let mut out = Vec::new();
        if (b >> 24) & 1 != (a >> 24) & 1 {
            let state = if (a >> 24) & 1 != 0 { "on" } else { "off" };
            out.push(format!("flush-to-zero (FPCR.FZ) turned {state}"));
        }
        if (b >> 22) & 3 != (a >> 22) & 3 {
            out.push("the rounding mode (FPCR.RMode) changed".into());
        }
        if out.is_empty() {
            out.push(format!("FPCR changed from {b:#x} to {a:#x}"));
        }
        out
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod arch {
    pub fn read() -> (u64, u16) {
        (0, 0)
    }
    pub fn write(_control: u64, _x87: u16) {}
    pub fn describe(_before: (u64, u16), _after: (u64, u16)) -> Vec<String> {
        Vec::new()
    }
}

impl FpEnv {
    /// The calling thread's control bits now.
    #[inline(always)]
    pub fn current() -> FpEnv {
        let (control, x87) = arch::read();
        FpEnv { control, x87 }
    }

    /// Makes them the calling thread's again (its exception flags kept).
    pub fn restore(self) {
        arch::write(self.control, self.x87);
    }

    /// What differs from `self` in `after`, in words ("flush-to-zero
    /// (MXCSR.FZ) turned on").
    pub fn changes_to(self, after: FpEnv) -> String {
        arch::describe((self.control, self.x87), (after.control, after.x87)).join(", ")
    }
}

thread_local! {
    /// The first change this thread's plugin calls made since the last
    /// [`take_change`]: the plugin, the function and what changed.
    static CHANGE: RefCell<Option<FpEnvChange>> = const { RefCell::new(None) };
}

/// A plugin call that returned with the calling thread's floating-point
/// environment changed (the host restored it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FpEnvChange {
    /// The plugin's vendor name.
    pub plugin: String,
    /// The function or operator called ("scale", "plugin init").
    pub function: String,
    /// What changed, in words.
    pub what: String,
}

impl std::fmt::Display for FpEnvChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plugin {} returned from {} with the calling thread's floating-point environment \
             changed ({}); the host restored it (ABI rule 12)",
            self.plugin, self.function, self.what
        )
    }
}

/// The first change recorded on this thread since the last call, if any,
/// and forgets it.
pub fn take_change() -> Option<FpEnvChange> {
    CHANGE.with(|c| c.borrow_mut().take())
}

pub(crate) fn record(change: FpEnvChange) {
    CHANGE.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Some(change);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_environment_is_seen_described_and_restored() {
        let before = FpEnv::current();
        #[cfg(target_arch = "x86_64")]
        {
            let changed = FpEnv {
                control: before.control | (1 << 15) | (1 << 6) | (2 << 13),
                x87: before.x87,
            };
            changed.restore();
            let after = FpEnv::current();
            before.restore();
            assert_eq!(after, changed);
            let what = before.changes_to(after);
            assert!(
                what.contains("flush-to-zero (MXCSR.FZ) turned on"),
                "{what}"
            );
            assert!(
                what.contains("denormals-are-zero (MXCSR.DAZ) turned on"),
                "{what}"
            );
            assert!(what.contains("from to nearest to upward"), "{what}");
            // Subnormals survive again once restored.
            let tiny = std::hint::black_box(f32::from_bits(1));
            assert_eq!((tiny * std::hint::black_box(1.0f32)).to_bits(), 1);
        }
        assert_eq!(FpEnv::current(), before);
    }

    #[test]
    fn exception_flags_are_not_control() {
        let before = FpEnv::current();
        // An inexact, overflowing division sets sticky flags only.
        let x = std::hint::black_box(f32::MAX) * std::hint::black_box(3.0f32);
        assert!(x.is_infinite());
        assert_eq!(FpEnv::current(), before);
    }
}
