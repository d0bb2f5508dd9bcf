//! How the numeric flags of every subcommand read their value, so that a
//! value that is not one the flag takes is refused in a sentence naming the
//! flag (`--steps must be a whole number of 1 or more; "-1" is negative`),
//! not with clap's "unexpected argument '-1' found" (a negative number after
//! a flag was taken for another flag) or Rust's "invalid digit found in
//! string".
//!
//! Each numeric flag is declared with `allow_negative_numbers = true` (so
//! that `--steps -1` reaches the flag rather than being parsed as the short
//! flag `-1`; a float flag with `allow_hyphen_values`, so that `-inf` and
//! `-.5` reach its range check) and one of these parsers: [`whole`] for
//! counts, indices and seeds, [`Number`] for fractions and seconds. They
//! check what the value can be at all (a whole number, not negative,
//! within the flag's type; a number); the subcommands still check each
//! flag's own range (`--steps 0`, `--iters 200000`, `--lr -0.1`) with
//! their own messages.

use std::ffi::OsStr;
use std::marker::PhantomData;

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;

/// A whole-number flag's parser: a count of at least `least` (0 or 1, for
/// the message only) that fits `T`.
#[derive(Debug)]
pub(crate) struct Whole<T> {
    least: u64,
    most: Option<u64>,
    of: PhantomData<fn() -> T>,
}

impl<T> Clone for Whole<T> {
    fn clone(&self) -> Self {
        Whole {
            least: self.least,
            most: self.most,
            of: PhantomData,
        }
    }
}

/// A parser for a whole-number flag whose values start at `least` (0 for
/// an index, a seed or an "every N, 0 for never"; 1 for a count): the
/// message for a negative or otherwise unreadable value says so. `least`
/// itself is not checked here (a subcommand says why 0 does not do).
pub(crate) fn whole<T>(least: u64) -> Whole<T> {
    Whole {
        least,
        most: None,
        of: PhantomData,
    }
}

impl<T> Whole<T> {
    /// The same parser, refusing a value above `most` too (for a flag
    /// whose subcommand does not check its upper bound itself).
    pub(crate) fn most(self, most: u64) -> Self {
        Whole {
            most: Some(most),
            ..self
        }
    }
}

/// The flag as the user writes it (`--steps`, `-n/--nproc`).
fn flag(arg: Option<&clap::Arg>) -> String {
    let Some(arg) = arg else {
        return "the value".into();
    };
    match (arg.get_short(), arg.get_long()) {
        (Some(s), Some(l)) => format!("-{s}/--{l}"),
        (None, Some(l)) => format!("--{l}"),
        (Some(s), None) => format!("-{s}"),
        (None, None) => arg.get_id().to_string(),
    }
}

/// A refusal of `value` for the flag, as clap prints its errors (`error:
/// ...`, usage, exit code 2).
fn refuse(cmd: &clap::Command, message: String) -> clap::Error {
    let mut cmd = cmd.clone();
    cmd.error(ErrorKind::ValueValidation, message)
}

/// The value as the message quotes it: escaped, cut after 200 characters.
fn quoted(value: &OsStr) -> String {
    polychip_comm::text::quoted(&value.to_string_lossy())
}

impl<T> TypedValueParser for Whole<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let flag = flag(arg);
        let what = match (self.least, self.most) {
            (least, Some(most)) => format!("a whole number from {least} to {most}"),
            (0, None) => "a whole number, 0 or more".to_string(),
            (n, None) => format!("a whole number of {n} or more"),
        };
        let fail = |why: &str| {
            refuse(
                cmd,
                format!("{flag} must be {what}; {}{why}", quoted(value)),
            )
        };
        let text = value.to_str().ok_or_else(|| fail(" is not text"))?.trim();
        if text.is_empty() {
            return Err(fail(" is empty"));
        }
        if text.starts_with('-') && text.len() > 1 {
            return Err(fail(" is negative"));
        }
        let n: u64 = match text.parse() {
            Ok(n) => n,
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => {
                return Err(fail(&format!(" is more than {}", u64::MAX)));
            }
            Err(_) => return Err(fail(" is not one")),
        };
        if let Some(most) = self.most.filter(|&m| n > m) {
            return Err(fail(&format!(" is more than {most}")));
        }
        T::try_from(n).map_err(|_| fail(" is too large"))
    }
}

/// A real-number flag's parser: any number `f64` reads (NaN and the
/// infinities too), refusing only what is not a number, naming the flag;
/// each such flag's range (`--lr` above 0, `--profile-error` 0 to 0.5,
/// `--case-timeout` seconds) is checked by its subcommand, whose message
/// says the range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Number;

impl TypedValueParser for Number {
    type Value = f64;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<f64, clap::Error> {
        let fail = |why: &str| {
            refuse(
                cmd,
                format!("{} must be a number; {}{why}", flag(arg), quoted(value)),
            )
        };
        let text = value.to_str().ok_or_else(|| fail(" is not text"))?.trim();
        match text.parse() {
            Ok(x) => Ok(x),
            Err(_) if text.is_empty() => Err(fail(" is empty")),
            Err(_) => Err(fail(" is not one")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[arg(long, allow_negative_numbers = true, value_parser = whole::<u64>(1))]
        steps: Option<u64>,
        #[arg(short = 'n', long, allow_negative_numbers = true, value_parser = whole::<usize>(0))]
        nproc: Option<usize>,
        #[arg(long, allow_negative_numbers = true, value_parser = whole::<u64>(0).most(60))]
        timeout: Option<u64>,
        #[arg(long, allow_hyphen_values = true, value_parser = Number)]
        lr: Option<f64>,
    }

    fn refusal(args: &[&str]) -> String {
        let e = Flags::try_parse_from([&["t"], args].concat()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation, "{e}");
        e.to_string()
    }

    #[test]
    fn a_negative_or_unreadable_value_is_refused_naming_the_flag() {
        let e = refusal(&["--steps", "-1"]);
        assert!(
            e.contains("--steps must be a whole number of 1 or more; \"-1\" is negative"),
            "{e}"
        );
        let e = refusal(&["--steps=-1"]);
        assert!(e.contains("\"-1\" is negative"), "{e}");
        let e = refusal(&["-n", "-3"]);
        assert!(
            e.contains("-n/--nproc must be a whole number, 0 or more; \"-3\" is negative"),
            "{e}"
        );
        let e = refusal(&["--steps", "1.5"]);
        assert!(e.contains("\"1.5\" is not one"), "{e}");
        let e = refusal(&["--steps", "99999999999999999999"]);
        assert!(e.contains("is more than 18446744073709551615"), "{e}");
        for (v, why) in [("-1", "is negative"), ("61", "is more than 60")] {
            let e = refusal(&["--timeout", v]);
            assert!(
                e.contains(&format!(
                    "--timeout must be a whole number from 0 to 60; \"{v}\" {why}"
                )),
                "{e}"
            );
        }
        let e = refusal(&["--lr", "x"]);
        assert!(e.contains("--lr must be a number; \"x\" is not one"), "{e}");
        // A long or hostile value is quoted escaped and cut.
        let long = format!("--steps=-{}\u{1b}[2J", "9".repeat(5000));
        let e = refusal(&[&long]);
        assert!(e.len() < 600 && !e.contains('\u{1b}'), "{e}");
    }

    #[test]
    fn values_in_range_are_read_as_before() {
        let f = Flags::try_parse_from(["t", "--steps", "7", "-n", "0", "--lr", "3e-4"]).unwrap();
        assert_eq!((f.steps, f.nproc, f.lr), (Some(7), Some(0), Some(3e-4)));
        // Negative, NaN and infinite numbers reach the subcommand's range
        // check, whose message says the range.
        for (v, want) in [("-0.1", -0.1), ("-.5", -0.5), ("-inf", f64::NEG_INFINITY)] {
            let f = Flags::try_parse_from(["t", "--lr", v]).unwrap();
            assert_eq!(f.lr, Some(want));
        }
        assert!(
            Flags::try_parse_from(["t", "--lr", "NaN"])
                .unwrap()
                .lr
                .unwrap()
                .is_nan()
        );
        let f = Flags::try_parse_from(["t", "--steps", " 5 "]).unwrap();
        assert_eq!(f.steps, Some(5));
    }
}
