//! Passes the target triple to the tests, which compile C and C++ against
//! the header and the library.
fn main() {
    println!(
        "cargo:rustc-env=TARGET_TRIPLE={}",
        std::env::var("TARGET").unwrap()
    );
}
