//! The plugin's configuration, read once from the environment when the host
//! loads it: how many devices to simulate, how much memory each has, and the
//! peak throughput each reports. A value that does not parse (or is out of
//! range) falls back to its default with a warning; an unset or empty
//! variable silently means the default.

/// Number of devices, `0..=64`.
pub const DEVICES_VAR: &str = "POLYCHIP_FERRITE_DEVICES";
/// Memory capacity of each device in MiB.
pub const MEMORY_VAR: &str = "POLYCHIP_FERRITE_MEMORY_MIB";
/// Peak matmul throughput of each device in GFLOP/s (f32, bf16 and f16 alike).
pub const PEAK_VAR: &str = "POLYCHIP_FERRITE_PEAK_GFLOPS";

/// Devices when [`DEVICES_VAR`] is unset.
pub const DEFAULT_DEVICES: u32 = 2;
/// The most devices the plugin simulates.
pub const MAX_DEVICES: u32 = 64;
/// MiB per device when [`MEMORY_VAR`] is unset.
pub const DEFAULT_MEMORY_MIB: u64 = 4096;
/// The most MiB a device may claim: 1 TiB (no value was too large until
/// 2026-12-06, so a device could report 2^63 bytes, which the planner
/// refuses as no chip's memory, and sizes built on it overflowed).
pub const MAX_MEMORY_MIB: u64 = 1 << 20;
/// The range of [`PEAK_VAR`] in GFLOP/s: the planner's range of peak
/// FLOP/s (1e6 to 1e20), so that every device Ferrite reports can be
/// planned for.
pub const PEAK_GFLOPS_RANGE: (f64, f64) = (1e-3, 1e11);
/// GFLOP/s per device when [`PEAK_VAR`] is unset: what one x86 core can
/// do in f32 at most (two 16-wide fused multiply-adds a cycle at 3 GHz),
/// so that no kernel on a core of its own runs above its device's peak
/// (the matmul reaches 108 GFLOP/s on one core of the project's machine:
/// `a @ b` of 512 x 512 through `polychip.torch` under `taskset -c 1`;
/// the 95 declared before made a profile's blocks look faster than the
/// peak, which `polychip plan --profile` warns of).
pub const DEFAULT_PEAK_GFLOPS: f64 = 200.0;

const MIB: u64 = 1 << 20;

/// What the environment asked for, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Number of devices.
    pub devices: u32,
    /// Capacity of each device in bytes.
    pub memory_bytes: u64,
    /// Peak FLOP/s of each device.
    pub peak_flops: f64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            devices: DEFAULT_DEVICES,
            memory_bytes: DEFAULT_MEMORY_MIB * MIB,
            peak_flops: DEFAULT_PEAK_GFLOPS * 1e9,
        }
    }
}

impl Config {
    /// Reads the process environment; `warn` receives one sentence per value
    /// that was ignored.
    pub fn from_env(warn: impl FnMut(&str)) -> Config {
        Config::from_lookup(
            |name| match std::env::var(name) {
                Ok(v) => Some(v),
                Err(std::env::VarError::NotPresent) => None,
                Err(std::env::VarError::NotUnicode(v)) => Some(v.to_string_lossy().into_owned()),
            },
            warn,
        )
    }

    /// Reads variables through `lookup` (so tests need not touch the process
    /// environment); `warn` receives one sentence per value that was ignored.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        mut warn: impl FnMut(&str),
    ) -> Config {
        let mut config = Config::default();
        if let Some(raw) = lookup(DEVICES_VAR) {
            match parse(&raw, |v: u32| v <= MAX_DEVICES) {
                Parsed::Unset => {}
                Parsed::Value(n) => config.devices = n,
                Parsed::Bad => warn(&format!(
                    "{DEVICES_VAR}={raw:?} is not an integer in 0..={MAX_DEVICES}; using the default {DEFAULT_DEVICES}"
                )),
            }
        }
        if let Some(raw) = lookup(MEMORY_VAR) {
            // 0 MiB would make every allocation fail, as a device that
            // cannot hold a tensor: refused as Cobalt refuses it.
            match parse(&raw, |v: u64| (1..=MAX_MEMORY_MIB).contains(&v)) {
                Parsed::Unset => {}
                Parsed::Value(mib) => config.memory_bytes = mib * MIB,
                Parsed::Bad => warn(&format!(
                    "{MEMORY_VAR}={raw:?} is not a number of MiB from 1 to {MAX_MEMORY_MIB} (1 TiB); using the default {DEFAULT_MEMORY_MIB}"
                )),
            }
        }
        if let Some(raw) = lookup(PEAK_VAR) {
            let (low, high) = PEAK_GFLOPS_RANGE;
            match parse(&raw, |v: f64| (low..=high).contains(&v)) {
                Parsed::Unset => {}
                Parsed::Value(gflops) => config.peak_flops = gflops * 1e9,
                Parsed::Bad => warn(&format!(
                    "{PEAK_VAR}={raw:?} is not a number of GFLOP/s from {low} to {high:e}; using the default {DEFAULT_PEAK_GFLOPS}"
                )),
            }
        }
        config
    }
}

enum Parsed<T> {
    Unset,
    Value(T),
    Bad,
}

fn parse<T: std::str::FromStr + Copy>(raw: &str, valid: impl Fn(T) -> bool) -> Parsed<T> {
    let value = raw.trim();
    if value.is_empty() {
        return Parsed::Unset;
    }
    match value.parse::<T>() {
        Ok(v) if valid(v) => Parsed::Value(v),
        _ => Parsed::Bad,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut warnings = Vec::new();
        let config = Config::from_lookup(|k| vars.get(k).cloned(), |w| warnings.push(w.to_owned()));
        (config, warnings)
    }

    #[test]
    fn defaults_when_unset_or_empty() {
        let (c, w) = config(&[]);
        assert_eq!(c, Config::default());
        assert_eq!(c.devices, 2);
        assert_eq!(c.memory_bytes, 4096 << 20);
        assert_eq!(c.peak_flops, 200e9);
        assert!(w.is_empty());
        let (c, w) = config(&[(DEVICES_VAR, " "), (MEMORY_VAR, ""), (PEAK_VAR, "")]);
        assert_eq!(c, Config::default());
        assert!(w.is_empty());
    }

    #[test]
    fn valid_values_are_used() {
        let (c, w) = config(&[(DEVICES_VAR, " 5 "), (MEMORY_VAR, "16"), (PEAK_VAR, "1.5")]);
        assert_eq!(
            c,
            Config {
                devices: 5,
                memory_bytes: 16 << 20,
                peak_flops: 1.5e9
            }
        );
        assert!(w.is_empty());
        assert_eq!(config(&[(DEVICES_VAR, "0")]).0.devices, 0);
        assert_eq!(config(&[(DEVICES_VAR, "64")]).0.devices, 64);
        assert_eq!(config(&[(MEMORY_VAR, "1")]).0.memory_bytes, 1 << 20);
    }

    #[test]
    fn bad_values_fall_back_with_a_warning() {
        let (c, w) = config(&[(DEVICES_VAR, "65"), (MEMORY_VAR, "lots"), (PEAK_VAR, "-3")]);
        assert_eq!(c, Config::default());
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(
            w[0].contains(DEVICES_VAR) && w[0].contains("\"65\""),
            "{}",
            w[0]
        );
        assert!(
            w[1].contains(MEMORY_VAR) && w[1].contains("4096"),
            "{}",
            w[1]
        );
        assert!(w[2].contains(PEAK_VAR), "{}", w[2]);
        for bad in ["-1", "two", "1.0", "99999999999"] {
            let (c, w) = config(&[(DEVICES_VAR, bad)]);
            assert_eq!(c.devices, DEFAULT_DEVICES, "{bad}");
            assert_eq!(w.len(), 1, "{bad}");
        }
        for bad in ["NaN", "inf", "0", "1e400"] {
            let (c, w) = config(&[(PEAK_VAR, bad)]);
            assert_eq!(c.peak_flops, 200e9, "{bad}");
            assert_eq!(w.len(), 1, "{bad}");
        }
        // 0 MiB (no tensor fits), more than 1 TiB (2^43 MiB was taken,
        // 8 EiB a device, until 2026-12-06) and more than u64 bytes alike.
        for bad in [
            "0".to_string(),
            (MAX_MEMORY_MIB + 1).to_string(),
            (1u64 << 43).to_string(),
            u64::MAX.to_string(),
        ] {
            let (c, w) = config(&[(MEMORY_VAR, &bad)]);
            assert_eq!(c.memory_bytes, DEFAULT_MEMORY_MIB << 20, "{bad}");
            assert!(
                w.len() == 1 && w[0].contains(MEMORY_VAR) && w[0].contains("from 1 to 1048576"),
                "{bad}: {w:?}"
            );
        }
        assert_eq!(config(&[(MEMORY_VAR, "1048576")]).0.memory_bytes, 1 << 40);
        // Past the planner's range of peaks (1e20 FLOP/s was taken).
        for bad in ["1e12", "1e-4", "1e300"] {
            let (c, w) = config(&[(PEAK_VAR, bad)]);
            assert_eq!(c.peak_flops, 200e9, "{bad}");
            assert!(w.len() == 1 && w[0].contains("to 1e11"), "{bad}: {w:?}");
        }
    }
}
