//! The catalog of planted bugs (`POLYCHIP_PLANTED_BUG`, see
//! `vendor-stubs/planted/src/mutants/`): each bug mutates exactly one
//! operator of an otherwise correct plugin, and `polychip conform` must flag
//! that operator. With `POLYCHIP_PLANTED_BUG=none` the planted plugin is
//! correct and passes the whole suite in every dtype, so a flagged operator
//! is the bug.
//!
//! One test per bug, each naming the check's message that flags it and
//! the dtypes it is checked in: f32 where the bug shows there (the suite
//! judges every dtype alike, so the others proved nothing more, at two to
//! three times the cases), the dtypes it shows in otherwise, or every
//! dtype (""). The one ignored bug is unobservable through the host (it
//! says why).

mod common;

fn plugin() -> String {
    common::built_plugin("libpolychip_testplugin_planted.so")
}

/// `polychip conform` on the planted plugin with `POLYCHIP_PLANTED_BUG=bug`:
/// exit status, output, JSON report.
fn conform(bug: &str, args: &[&str]) -> (i32, String, serde_json::Value) {
    let planted = plugin();
    let mut all = vec!["--plugin", planted.as_str()];
    all.extend_from_slice(args);
    common::conform_report(&all, &[("POLYCHIP_PLANTED_BUG", bug)])
}

/// Runs `op` (in `dtypes`, all when empty) with `bug` planted and asserts
/// the suite fails it, with a case label or message containing `message`.
/// A case is taken to hang after 5 s (`--case-timeout`).
fn flags(bug: &str, op: &str, dtypes: &str, message: &str) {
    let ops = format!("^{op}$");
    let mut args = vec!["--ops", ops.as_str(), "--case-timeout", "5"];
    if !dtypes.is_empty() {
        args.extend(["--dtype", dtypes]);
    }
    let (code, text, doc) = conform(bug, &args);
    assert!(doc.is_object(), "{bug}: no report:\n{text}");
    let failures = doc["failures"].as_array().unwrap();
    // "label: message" of every failed case.
    let messages: Vec<String> = failures
        .iter()
        .map(|f| {
            assert_eq!(f["result"]["op"], op, "{bug} flags another operator: {f}");
            format!(
                "{}: {}",
                f["result"]["label"].as_str().unwrap(),
                f["result"]["message"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        !messages.is_empty() && code == 1,
        "{bug}: the suite does not flag {op} (exit {code}):\n{text}"
    );
    assert!(
        messages.iter().any(|m| m.contains(message)),
        "{bug}: {op} failed, but no message contains {message:?}: {messages:#?}"
    );
}

/// Every name of the plugin's catalog, from the error an unknown name gives.
fn catalog_names() -> Vec<String> {
    let (code, text, _) = conform("no-such-bug", &["--ops", "^fill$"]);
    assert_ne!(
        code, 0,
        "an unknown bug name must fail plugin init:\n{text}"
    );
    let list = text
        .split("known (one a line):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("the init error lists the known names:\n{text}"));
    // The names, up to the first line that is not one.
    list.lines()
        .map(str::trim)
        .take_while(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
        .filter(|s| *s != "none")
        .map(str::to_string)
        .collect()
}

#[test]
fn with_no_bug_planted_the_plugin_passes_every_operator_in_every_dtype() {
    let (code, text, doc) = conform("none", &[]);
    assert_eq!(code, 0, "{text}");
    common::assert_passes_every_operator("the planted plugin", &doc);
}

/// A hung case fails alone: its worker is killed, a new one goes on with
/// the next case, and the units after it run as usual.
#[test]
fn a_hung_case_fails_alone_and_the_suite_goes_on() {
    let started = std::time::Instant::now();
    let (code, text, doc) = conform(
        "rsqrt-hangs-on-large-tensors",
        &[
            "--ops",
            "^(neg|rsqrt|sqrt)$",
            "--dtype",
            "f32",
            "--case-timeout",
            "5",
        ],
    );
    assert_eq!(code, 1, "{text}");
    let rows = doc["rows"].as_array().unwrap();
    let row = |op: &str| rows.iter().find(|r| r["op"] == op).unwrap();
    for op in ["neg", "sqrt"] {
        assert_eq!(row(op)["failed"], 0, "{op}: {text}");
        assert!(row(op)["passed"].as_u64().unwrap() > 0, "{op}: {text}");
    }
    let failures = doc["failures"].as_array().unwrap();
    assert!(!failures.is_empty());
    for f in failures {
        assert_eq!(f["result"]["op"], "rsqrt", "{f}");
        let label = f["result"]["label"].as_str().unwrap();
        assert!(
            label.contains("realistic"),
            "only large tensors hang: {label}"
        );
        assert!(
            f["result"]["message"]
                .as_str()
                .unwrap()
                .starts_with("the plugin hung: no result within 5 s"),
            "{f}"
        );
    }
    // rsqrt's small cases ran and passed, before and after each hang.
    assert!(row("rsqrt")["passed"].as_u64().unwrap() > 10, "{text}");
    // Each hang costs its 5 s, though the kernel prints a heartbeat for
    // 60 s (the timeout counts from the last result, not the last line);
    // the rest of the run takes seconds (up to 15 on a loaded machine).
    // (5 s, not 2: a new worker, after a hang, starts this debug binary and
    // loads the plugin within the same bound.)
    let hung = failures.len() as u64;
    println!("{hung} hung case(s); the run took {:?}", started.elapsed());
    assert!(
        started.elapsed().as_secs() < 5 * hung + 40,
        "{hung} hangs of 5 s took {:?}",
        started.elapsed()
    );
}

#[test]
fn an_unknown_bug_name_fails_init_and_every_catalog_entry_has_a_test() {
    let names = catalog_names();
    let mut tested: Vec<&str> = TESTED.to_vec();
    tested.sort_unstable();
    let mut listed: Vec<&str> = names.iter().map(String::as_str).collect();
    listed.sort_unstable();
    assert_eq!(listed, tested, "the catalog and this file's tests differ");
}

/// Declares one test per bug, and the list of tested names.
macro_rules! bugs {
    ($($(#[$attr:meta])* $test:ident: $bug:literal on $op:literal in $dtypes:literal => $message:literal;)*) => {
        const TESTED: &[&str] = &[$($bug),*];
        $(
            $(#[$attr])*
            #[test]
            fn $test() {
                flags($bug, $op, $dtypes, $message);
            }
        )*
    };
}

bugs! {
    // Numerics, edge values and refusals of the small cases.
    gelu_erf_form: "gelu-erf-form" on "gelu" in "f32" => "outside tolerance";
    swiglu_low_precision_sigmoid: "swiglu-low-precision-sigmoid" on "swiglu" in "f32" => "outside tolerance";
    exp_fast_approx: "exp-fast-approx" on "exp" in "f32" => "outside tolerance";
    rms_norm_eps_outside_sqrt: "rms-norm-eps-outside-sqrt" on "rms_norm" in "f32" => "outside tolerance";
    layer_norm_unbiased_variance: "layer-norm-unbiased-variance" on "layer_norm" in "f32" => "outside tolerance";
    adamw_no_bias_correction: "adamw-no-bias-correction" on "adamw" in "f32" => "outside tolerance";
    adamw_ignores_weight_decay: "adamw-ignores-weight-decay" on "adamw" in "f32" => "outside tolerance";
    adamw_skips_bf16: "adamw-skips-bf16" on "adamw" in "bf16" => "outside tolerance";
    cast_bf16_ties_away: "cast-bf16-ties-away" on "cast" in "f32" => "outside tolerance";
    max_ignores_nan: "max-ignores-nan" on "max" in "f32" => "want NaN";
    argmax_last_tie: "argmax-last-tie" on "argmax" in "f32" => "outside tolerance";
    log_zero_nan: "log-zero-nan" on "log" in "f32" => "got NaN, want -inf";
    pow_scalar_nan_zero_exponent: "pow-scalar-nan-zero-exponent" on "pow_scalar" in "f32" => "got NaN, want 1";
    embedding_clamps_index: "embedding-clamps-index" on "embedding" in "f32" => "accepted a call it must refuse";
    rope_backward_no_write: "rope-backward-no-write" on "rope_backward" in "f32" => "never wrote";
    cross_entropy_mean_over_all_rows: "cross-entropy-mean-over-all-rows" on "cross_entropy" in "f32" => "ignored rows";
    embedding_backward_racy_duplicates: "embedding-backward-racy-duplicates" on "embedding_backward" in "f32" => "repeated";
    // Layouts: byte offsets, zero and negative strides, gaps, row slices,
    // a transposed second operand.
    sub_ignores_byte_offset: "sub-ignores-byte-offset" on "sub" in "f32" => "outside tolerance";
    div_zero_stride_as_compact: "div-zero-stride-as-compact" on "div" in "f32" => "broadcast along dim";
    tanh_negative_stride_abs: "tanh-negative-stride-abs" on "tanh" in "f32" => "reversed along dim";
    relu_output_assumed_compact: "relu-output-assumed-compact" on "relu" in "f32" => "the plugin wrote outside output out";
    rms_norm_ignores_row_stride: "rms-norm-ignores-row-stride" on "rms_norm" in "f32" => "";
    layer_norm_input_rows_assumed_packed: "layer-norm-input-rows-assumed-packed" on "layer_norm" in "f32" => "input a row slice of wider rows";
    matmul_transposed_b_as_compact: "matmul-transposed-b-as-compact" on "matmul" in "f32" => "outside tolerance";
    mul_column_broadcast_as_row: "mul-column-broadcast-as-row" on "mul" in "f32" => "[6, 6] [6, 1]";
    silu_backward_grad_out_as_compact: "silu-backward-grad-out-as-compact" on "silu_backward" in "f32" => "every tensor non-compact";
    gelu_backward_grad_out_gaps_as_compact: "gelu-backward-grad-out-gaps-as-compact" on "gelu_backward" in "f32" => "grad_out with gaps (stride 2)";
    // Shapes that kernels special-case: a vector remainder, M = 1 (GEMV),
    // K = 1 (a rank-1 update).
    sum_drops_vector_tail: "sum-drops-vector-tail" on "sum" in "f32" => "[5, 37] dim -1";
    matmul_gemv_ignores_transpose_b: "matmul-gemv-ignores-transpose-b" on "matmul" in "f32" => "a [1, 40] b [24, 40] ta false tb true";
    matmul_rank1_ignores_beta: "matmul-rank1-ignores-beta" on "matmul" in "f32" => "a [6, 1] b [1, 5]";
    // In-place calls the spec permits.
    softmax_in_place_second_pass: "softmax-in-place-second-pass" on "softmax" in "f32" => "in place (out is input)";
    swiglu_backward_in_place_reread: "swiglu-backward-in-place-reread" on "swiglu_backward" in "f32" => "in place";
    // Writes outside the output: guard zones around it and in its gaps.
    add_writes_one_past_end: "add-writes-one-past-end" on "add" in "f32" => "1 element(s) after its last element";
    neg_zeroes_element_before: "neg-zeroes-element-before" on "neg" in "f32" => "1 element(s) before its first element";
    gelu_backward_writes_gaps: "gelu-backward-writes-gaps" on "gelu_backward" in "f32" => "in a gap between its elements";
    // Realistic sizes: thresholds, tile edges, index widths, long sums.
    log_softmax_wide_row_drops_tile: "log-softmax-wide-row-drops-tile" on "log_softmax" in "f32" => "realistic [4, 152064]";
    embedding_u16_index: "embedding-u16-index" on "embedding" in "f32" => "realistic";
    sum_squares_half_accumulation: "sum-squares-half-accumulation" on "sum_squares" in "bf16,f16" => "realistic";
    linear_tile_edge: "linear-tile-edge" on "linear" in "f32" => "realistic";
    cross_entropy_wide_no_max_shift: "cross-entropy-wide-no-max-shift" on "cross_entropy" in "f32" => "logits near 100";
    linear_row_tile_edge: "linear-row-tile-edge" on "linear" in "f32" => "realistic [300, 256]";
    attention_backward_key_tile_edge: "attention-backward-key-tile-edge" on "attention_backward" in "f32" => "realistic [1, 1, 300, 128] causal";
    // Special cases of attention: fewer queries than keys, grouped heads.
    attention_causal_top_left: "attention-causal-top-left" on "attention" in "f32" => "causal seq_q 8 < seq_kv 16";
    // What a call leaves behind: its thread's floating-point environment
    // (x86-64 only, where the planted bug changes it), a workspace per call.
    #[cfg(target_arch = "x86_64")]
    scale_leaves_ftz_on: "scale-leaves-ftz-on" on "scale" in "f32" => "flush-to-zero (MXCSR.FZ) turned on";
    rms_norm_leaks_workspace: "rms-norm-leaks-workspace" on "rms_norm" in "f32" => "memory keeps growing with every call";
    layer_norm_leaves_signals_blocked: "layer-norm-leaves-signals-blocked" on "layer_norm" in "f32" => "signal mask changed (blocked SIGINT, SIGTERM)";
    adamw_pins_calling_thread: "adamw-pins-calling-thread" on "adamw" in "f32" => "CPU affinity changed from CPUs";
    attention_gqa_heads_interleaved: "attention-gqa-heads-interleaved" on "attention" in "f32" => "gqa 4/2";
    rope_backward_head_dim_64_pairs: "rope-backward-head-dim-64-pairs" on "rope_backward" in "f32" => "realistic [1, 256, 4, 128] half-split";
    rms_norm_backward_row_over_4096: "rms-norm-backward-row-over-4096" on "rms_norm_backward" in "f32" => "realistic [16, 8192]";
    adamw_step_i16: "adamw-step-i16" on "adamw" in "f32" => "step 100000";
    // Bounds from error analysis, the bias test, ties, edge values.
    silu_truncates_half: "silu-truncates-half" on "silu" in "bf16,f16" => "biased rounding";
    log_softmax_backward_half_accumulation: "log-softmax-backward-half-accumulation" on "log_softmax_backward" in "bf16,f16" => "outside tolerance";
    cast_f64_bf16_double_rounding: "cast-f64-bf16-double-rounding" on "cast" in "f64" => "outside tolerance";
    relu_backward_at_zero: "relu-backward-at-zero" on "relu_backward" in "f32" => "outside tolerance";
    sqrt_neg_zero: "sqrt-neg-zero" on "sqrt" in "f32" => "want -0";
    neg_as_zero_minus: "neg-as-zero-minus" on "neg" in "f32" => "want -0";
    scale_alpha_zero_memset: "scale-alpha-zero-memset" on "scale" in "f32" => "special values alpha 0";
    exp_flushes_subnormals: "exp-flushes-subnormals" on "exp" in "f32,bf16" => "results in the subnormal range";
    cast_f16_saturates: "cast-f16-saturates" on "cast" in "f32" => "(= inf in f16)";
    silu_f16_flushes_subnormals: "silu-f16-flushes-subnormals" on "silu" in "f16" => "large negative inputs";
    silu_backward_negative_cutoff: "silu-backward-negative-cutoff" on "silu_backward" in "f32" => "large negative inputs";
    argmax_all_neg_inf_row: "argmax-all-neg-inf-row" on "argmax" in "f32" => "rows of -inf";
    softmax_running_max_from_zero: "softmax-running-max-from-zero" on "softmax" in "f32" => "large negative logits";
    silu_backward_far_tail_nan: "silu-backward-far-tail-nan" on "silu_backward" in "f32" => "inputs from -110";
    cast_nan_payload_to_infinity: "cast-nan-payload-to-infinity" on "cast" in "f64" => "outside tolerance";
    copy_i64_through_double: "copy-i64-through-double" on "copy" in "i64" => "where it must be 9007199254740993";
    // State shared between calls without a lock: only calls from several
    // threads at once show it.
    softmax_shared_scratch: "softmax-shared-scratch" on "softmax" in "f32" => "wrong when called from";
    softmax_rows_one_stride: "softmax-rows-one-stride" on "softmax" in "f32" => "permuted";
    rms_norm_drops_vector_tail: "rms-norm-drops-vector-tail" on "rms_norm" in "f32" => "[3, 7]";
    linear_no_inner_dim_skips_write: "linear-no-inner-dim-skips-write" on "linear" in "f32" => "[3, 0] N 5";
    neg_output_inner_stride_flipped: "neg-output-inner-stride-flipped" on "neg" in "f32" => "out reversed along dim 2";
    embedding_half_pair_store_past_end: "embedding-half-pair-store-past-end" on "embedding" in "bf16,f16" => "the plugin wrote outside output out";
    adamw_epsilon_hat: "adamw-epsilon-hat" on "adamw" in "f32" => "gradients about eps";
    adamw_lr_zero_skips_moments: "adamw-lr-zero-skips-moments" on "adamw" in "f32" => " lr 0 ";
    // State kept between calls: a cache keyed by address.
    linear_weight_cache_by_address: "linear-weight-cache-by-address" on "linear" in "f32" => "after a call with other values in the same buffers";
    // A kernel that never returns: each such case fails as hung and the
    // suite goes on to the next.
    rsqrt_hangs_on_large_tensors: "rsqrt-hangs-on-large-tensors" on "rsqrt" in "f32" => "the plugin hung: no result within 5 s";
    // Streams and events (the stream case of each unit).
    stream_wait_event_ignored: "stream-wait-event-ignored" on "copy" in "f32" => "on a stream, behind another stream's work";
    event_record_completes_at_once: "event-record-completes-at-once" on "copy" in "f32" => "on a stream, behind another stream's work";
    event_synchronize_returns_at_once: "event-synchronize-returns-at-once" on "copy" in "f32" => "then event_synchronize";
    stream_synchronize_returns_at_once: "stream-synchronize-returns-at-once" on "copy" in "f64" => "then stream_synchronize";
    add_ignores_stream: "add-ignores-stream" on "add" in "f32" => "on a stream, behind another stream's work";
    // Refusals and the ABI's contract.
    cross_entropy_refuses_internal: "cross-entropy-refuses-internal" on "cross_entropy" in "f32" => "must be refused with POLYCHIP_ERROR_INVALID_ARGUMENT";
    embedding_backward_foreign_error: "embedding-backward-foreign-error" on "embedding_backward" in "f32" => "never created";
    cross_entropy_backward_stale_error: "cross-entropy-backward-stale-error" on "cross_entropy_backward" in "f32" => "already taken back";
    embedding_index_narrowed_to_i32: "embedding-index-narrowed-to-i32" on "embedding" in "f32" => "index 4294967297 out of range";
    cross_entropy_backward_target_narrowed_to_i32: "cross-entropy-backward-target-narrowed-to-i32" on "cross_entropy_backward" in "f32" => "target 4294967196 out of range";
    // Mutation round 9: other scalar values, an infinity before a NaN,
    // overflow in a norm, rows of no elements, a late bad index, and the
    // sparest descriptors the ABI allows.
    add_alpha_zero_skips_b: "add-alpha-zero-skips-b" on "add" in "f32" => "special values alpha 0";
    max_stops_at_infinity: "max-stops-at-infinity" on "max" in "f32" => "+inf before NaN";
    sum_squares_scaled_by_max: "sum-squares-scaled-by-max" on "sum_squares" in "f32" => "an infinity";
    rms_norm_zero_width_skips_stats: "rms-norm-zero-width-skips-stats" on "rms_norm" in "f32" => "[3, 0]";
    attention_scale_zero_as_unset: "attention-scale-zero-as-unset" on "attention" in "f32" => "scale 0";
    embedding_check_first_block: "embedding-check-first-block" on "embedding" in "f32" => "out of range after 1100 in range";
    mul_null_strides_refused: "mul-null-strides-refused" on "mul" in "f32" => "NULL strides for compact tensors";
    sum_null_data_refused: "sum-null-data-refused" on "sum" in "f32" => "NULL data for empty ones";
    relu_backward_nan_input_zero: "relu-backward-nan-input-zero" on "relu_backward" in "f32" => "special values";
    // Mutation round 10: rows and lanes of one, and a NaN past a lane's
    // first block.
    softmax_row_of_one_as_one: "softmax-row-of-one-as-one" on "softmax" in "f32" => "rows of one logit";
    sum_unit_dim_as_copy: "sum-unit-dim-as-copy" on "sum" in "f32" => "[6, 1] strided dim 1";
    max_nan_first_block_only: "max-nan-first-block-only" on "max" in "f32" => "a NaN past the first 512";
    max_into_uninitialised_output: "max-into-uninitialised-output" on "max" in "f32" => "outputs holding a large finite value";
    matmul_gemv_n_reads_a_packed: "matmul-gemv-n-reads-a-packed" on "matmul" in "" => "a [5, 3] b [5, 1] ta true";
    layer_norm_row_of_one_as_bias: "layer-norm-row-of-one-as-bias" on "layer_norm" in "f32" => "rows of one element";
    // A NaN or +inf score taken for a row that saw no key.
    attention_nan_row_as_masked: "attention-nan-row-as-masked" on "attention" in "f32" => "NaN in q";
    // Mutation round 11: -inf leading a row, f16 sums past 65504 brought
    // back by alpha, an ignored odd last row.
    softmax_online_neg_inf_prefix: "softmax-online-neg-inf-prefix" on "softmax" in "f32" => "led by 2, 300 and 1030 -inf";
    matmul_half_rounds_before_alpha: "matmul-half-rounds-before-alpha" on "matmul" in "f16" => "sums past 65504";
    cross_entropy_odd_last_row_counted: "cross-entropy-odd-last-row-counted" on "cross_entropy" in "f32" => "odd rows, the last ignored";
    pow_scalar_half_as_sqrt: "pow-scalar-half-as-sqrt" on "pow_scalar" in "f32" => "exponent 0.5 special values";
    sigmoid_overflowing_exp: "sigmoid-overflowing-exp" on "sigmoid" in "f32" => "results in the subnormal range";
    copy_quiets_signalling_nan: "copy-quiets-signalling-nan" on "copy" in "f32" => "where it must be 0x7f800001";
    memcpy_d2d_from_allocation_start: "memcpy-d2d-from-allocation-start" on "copy" in "f32" => "staged by memcpy_d2d";
    // Mutation round 13: a broadcast `a`, a batch of accumulating
    // products, square operands.
    sub_swaps_column_a: "sub-swaps-column-a" on "sub" in "f32" => "a [5, 1] broadcast against b [5, 6]";
    matmul_batched_beta_first_only: "matmul-batched-beta-first-only" on "matmul" in "f32" => "every batch accumulating";
    matmul_transpose_inferred_when_square: "matmul-transpose-inferred-when-square" on "matmul" in "f32" => "square operands transposed";
    linear_bias_per_row_when_square: "linear-bias-per-row-when-square" on "linear" in "f32" => "as many rows as output features";
    layer_norm_backward_grad_bias_rows_when_square: "layer-norm-backward-grad-bias-rows-when-square" on "layer_norm_backward" in "f32" => "as many rows as features";
    // ABI 1.3: sin reduced in f32, select as a blend, masked_fill's value
    // through f32, eq by subtraction, convert wrapping past an integer range, arange as
    // a running sum, integer add saturating.
    sin_reduced_in_f32: "sin-reduced-in-f32" on "sin" in "f32" => "large arguments up to 1e5";
    select_arithmetic_blend: "select-arithmetic-blend" on "select" in "f32" => "NaN and infinities in the branch not taken";
    masked_fill_value_through_f32: "masked-fill-value-through-f32" on "masked_fill" in "" => "a rounding tie, or past 2^24";
    eq_by_subtraction: "eq-by-subtraction" on "eq" in "f32" => "special values against themselves";
    convert_integer_wraps: "convert-integer-wraps" on "convert" in "f32" => "specials, ties, range ends";
    convert_narrowing_saturates: "convert-narrowing-saturates" on "convert" in "i32,i64" => "specials, ties, range ends";
    arange_accumulates: "arange-accumulates" on "arange" in "f32" => "a step that is not a power of two";
    add_int_saturates: "add-int-saturates" on "add" in "i32,i64" => "wrapping past the ends of the range";
    // Mutation round 14: a zero's sign, 0-d operands a narrower kernel
    // argument cannot hold, a 0-d cond, square shapes, two roundings,
    // arange's rounding and its values past 2^53.
    sin_zero_positive: "sin-zero-positive" on "sin" in "f32" => "±0 and arguments so small that sin(x) is x";
    select_scalar_b_through_double: "select-scalar-b-through-double" on "select" in "f32" => "a 0-d b holding bits a double cannot carry";
    lt_scalar_as_f32: "lt-scalar-as-f32" on "lt" in "f64,i64" => "a 0-d b against its neighbours";
    select_scalar_cond_repeats: "select-scalar-cond-repeats" on "select" in "f32" => "cond 0-d true a [3, 1] b [1, 4]";
    masked_fill_mask_per_row_when_square: "masked-fill-mask-per-row-when-square" on "masked_fill" in "f32" => "a square input, the mask per column";
    convert_int_bf16_through_f32: "convert-int-bf16-through-f32" on "convert" in "i32,i64" => "integers one past a bf16 tie";
    convert_f16_overflow_at_max: "convert-f16-overflow-at-max" on "convert" in "f32,f64" => "just past the largest f16";
    arange_fused: "arange-fused" on "arange" in "" => "the product rounded before the sum";
    arange_i64_in_integers: "arange-i64-in-integers" on "arange" in "i64" => "past 2^53: the f64 values";
    // ABI 1.4: a negative index wrapped, half-precision updates rounded one
    // at a time, a running sum in the dtype, a row read in part, NaN taken
    // for zero, i64 bits through a double or a 32-bit kernel, a bool sum.
    gather_wraps_negative_index: "gather-wraps-negative-index" on "gather" in "f32" => "accepted a call it must refuse";
    scatter_add_rounds_per_update: "scatter-add-rounds-per-update" on "scatter_add" in "f16,bf16" => "eight half-ULP updates";
    cumsum_accumulates_in_dtype: "cumsum-accumulates-in-dtype" on "cumsum" in "f16,bf16" => "small positive terms";
    any_checks_first_1024: "any-checks-first-1024" on "any" in "f32" => "the deciding element last";
    all_nan_as_zero: "all-nan-as-zero" on "all" in "f32" => "every pair of special values";
    bitwise_and_through_f64: "bitwise-and-through-f64" on "bitwise_and" in "i64" => "extremes";
    bitwise_or_bool_as_sum: "bitwise-or-bool-as-sum" on "bitwise_or" in "bool" => "";
    bitwise_xor_low_32_bits: "bitwise-xor-low-32-bits" on "bitwise_xor" in "i64" => "extremes";
    // Mutation round 15: a running sum from -0, a nonzero test on the low
    // byte, integer updates saturating or through double, an index_select
    // fast path written for dim 0.
    cumsum_starts_negative_zero: "cumsum-starts-negative-zero" on "cumsum" in "f32,bf16" => "rows starting with -0";
    any_tests_low_byte: "any-tests-low-byte" on "any" in "i32,i64" => "whose low byte is 0";
    scatter_add_int_saturates: "scatter-add-int-saturates" on "scatter_add" in "i32,i64" => "past the ends of the range wrap";
    scatter_add_int_through_f64: "scatter-add-int-through-f64" on "scatter_add" in "i64" => "past the ends of the range wrap";
    gather_index_select_dim0_only: "gather-index-select-dim0-only" on "gather" in "f32" => "index_select along columns";
    // Mutation round 16: lines past a grid's second dimension never reached.
    cumsum_first_65535_lines: "cumsum-first-65535-lines" on "cumsum" in "f32" => "more lines than 65,535";
    softmax_first_65535_rows: "softmax-first-65535-rows" on "softmax" in "f32" => "more rows than 65,535";
    sum_first_65535_outputs: "sum-first-65535-outputs" on "sum" in "f32" => "more outputs than 65,535";
    // Mutation round 17: formulas exact in real arithmetic, wrong in f32.
    layer_norm_one_pass_variance: "layer-norm-one-pass-variance" on "layer_norm" in "f32" => "rows with mean 100";
    log_softmax_of_softmax: "log-softmax-of-softmax" on "log_softmax" in "f32" => "got -inf, want -";
    pow_via_exp_log: "pow-via-exp-log" on "pow_scalar" in "f32" => "exponent 3 [40] strided: output out";
    // The host refuses step 0 itself (its argument checks run before any
    // plugin code), so no caller can reach this plugin's refusal: the bug is
    // unobservable through the host, and the suite cannot flag it.
    #[ignore = "unobservable: the host refuses adamw step 0 before the plugin is called"]
    adamw_refusal_wrong_code: "adamw-refusal-wrong-code" on "adamw" in "f32" => "";
}
