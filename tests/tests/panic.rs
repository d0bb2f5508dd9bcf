//! A Rust plugin that panics: the SDK's firewall turns the panic into an
//! error object, nothing unwinds into the host, and the plugin and the host
//! keep working.

mod common;

use polychip_host::{DType, ErrorCode, HostError, MatmulOptions};

#[test]
fn a_panicking_plugin_call_becomes_an_error_and_the_host_goes_on() {
    let device = common::first_device(&common::bundled("polychip_testplugin_planted"));
    let a = device.zeros(DType::F32, &[2, 2]).unwrap();
    let out = device.zeros(DType::F32, &[2, 2]).unwrap();
    let error = device
        .exec()
        .matmul(&a, &a, &out, MatmulOptions::default())
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Panic);
    assert!(
        matches!(
            error,
            HostError::Plugin {
                function: "matmul",
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("Planted: matmul panicked: planted bug: matmul panics on shape [2, 2]"),
        "{message}"
    );
    // The same plugin still serves other calls.
    device.exec().fill(&a, 4.0).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), [4.0; 4]);
}
