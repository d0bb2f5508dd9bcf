//! Op-table entries for a plugin type `P`: one function per op-table
//! field, returning the shim that [`crate::export_plugin!`] stores there when
//! a plugin lists the operator.

/// One function per op-table field, named like the field.
pub mod ops {
    use super::super::basic;
    use super::super::nn;
    use crate::abi::*;
    use crate::plugin::Plugin;

    macro_rules! entries {
        ($($name:ident: $ty:ty => $shim:expr;)*) => {$(
            #[doc = concat!("The `", stringify!($name), "` entry.")]
            pub fn $name<P: Plugin>() -> $ty {
                Some($shim)
            }
        )*};
    }

    entries! {
        fill: PolychipFillFn => basic::fill::<P>;
        copy: PolychipCopyFn => basic::copy::<P>;
        cast: PolychipCastFn => basic::cast::<P>;
        add: PolychipBinaryFn => basic::binary::<P, 0>;
        sub: PolychipBinaryFn => basic::binary::<P, 1>;
        mul: PolychipBinaryFn => basic::binary::<P, 2>;
        div: PolychipBinaryFn => basic::binary::<P, 3>;
        matmul: PolychipMatmulFn => basic::matmul::<P>;
        softmax: PolychipSoftmaxFn => basic::softmax::<P>;
        neg: PolychipUnaryFn => nn::unary::<P, 0>;
        exp: PolychipUnaryFn => nn::unary::<P, 1>;
        log: PolychipUnaryFn => nn::unary::<P, 2>;
        sqrt: PolychipUnaryFn => nn::unary::<P, 3>;
        rsqrt: PolychipUnaryFn => nn::unary::<P, 4>;
        tanh: PolychipUnaryFn => nn::unary::<P, 5>;
        pow_scalar: PolychipPowScalarFn => nn::pow_scalar::<P>;
        relu: PolychipUnaryFn => nn::unary::<P, 6>;
        relu_backward: PolychipActivationBackwardFn => nn::activation_backward::<P, 0>;
        silu: PolychipUnaryFn => nn::unary::<P, 7>;
        silu_backward: PolychipActivationBackwardFn => nn::activation_backward::<P, 1>;
        gelu: PolychipUnaryFn => nn::unary::<P, 8>;
        gelu_backward: PolychipActivationBackwardFn => nn::activation_backward::<P, 2>;
        swiglu: PolychipSwigluFn => nn::swiglu::<P>;
        swiglu_backward: PolychipSwigluBackwardFn => nn::swiglu_backward::<P>;
        sum: PolychipReduceFn => nn::reduce::<P, 0>;
        mean: PolychipReduceFn => nn::reduce::<P, 1>;
        max: PolychipReduceFn => nn::reduce::<P, 2>;
        argmax: PolychipReduceFn => nn::reduce::<P, 3>;
        sum_squares: PolychipSumSquaresFn => nn::sum_squares::<P>;
        linear: PolychipLinearFn => nn::linear::<P>;
        softmax_backward: PolychipSoftmaxBackwardFn => nn::softmax_backward::<P, 0>;
        log_softmax: PolychipSoftmaxFn => nn::log_softmax::<P>;
        log_softmax_backward: PolychipSoftmaxBackwardFn => nn::softmax_backward::<P, 1>;
        rms_norm: PolychipRmsNormFn => nn::rms_norm::<P>;
        rms_norm_backward: PolychipRmsNormBackwardFn => nn::rms_norm_backward::<P>;
        layer_norm: PolychipLayerNormFn => nn::layer_norm::<P>;
        layer_norm_backward: PolychipLayerNormBackwardFn => nn::layer_norm_backward::<P>;
        rope: PolychipRopeFn => nn::rope::<P, 0>;
        rope_backward: PolychipRopeFn => nn::rope::<P, 1>;
        attention: PolychipAttentionFn => nn::attention::<P>;
        attention_backward: PolychipAttentionBackwardFn => nn::attention_backward::<P>;
        embedding: PolychipEmbeddingFn => nn::embedding::<P>;
        embedding_backward: PolychipEmbeddingBackwardFn => nn::embedding_backward::<P>;
        cross_entropy: PolychipCrossEntropyFn => nn::cross_entropy::<P>;
        cross_entropy_backward: PolychipCrossEntropyBackwardFn => nn::cross_entropy_backward::<P>;
        adamw: PolychipAdamwFn => nn::adamw::<P>;
        scale: PolychipScaleFn => nn::scale::<P>;
    }
}
