//! The byte-level corpus: splits, deterministic batches, refusals.

use std::path::PathBuf;

use polychip_train::TrainError;
use polychip_train::data::{BUNDLED, Corpus, MIN_BYTES, Split, VOCAB};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("data-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{}-{name}", std::process::id()))
}

#[test]
fn bundled_corpus_splits_ninety_ten() {
    let c = Corpus::bundled();
    let total = BUNDLED.len();
    assert!(total > 1_000_000, "Tiny Shakespeare is about 1.1 MB");
    assert_eq!(c.len(Split::Train) + c.len(Split::Validation), total);
    assert_eq!(c.len(Split::Validation), total / 10);
    assert_eq!(c.split(Split::Train), &BUNDLED[..c.len(Split::Train)]);
    assert!(c.source().contains("Shakespeare"));
    assert!(BUNDLED.starts_with(b"First Citizen:"));
    assert_eq!(VOCAB, 256);
}

#[test]
fn split_sizes_of_a_small_corpus() {
    let c = Corpus::from_bytes("mem", (0..=99u8).collect()).unwrap();
    assert_eq!(c.len(Split::Train), 90);
    assert_eq!(c.len(Split::Validation), 10);
    assert_eq!(c.split(Split::Validation)[0], 90);
    let c = Corpus::from_bytes("mem", vec![b'a'; 25]).unwrap();
    assert_eq!((c.len(Split::Train), c.len(Split::Validation)), (23, 2));
}

#[test]
fn batches_are_deterministic_and_depend_on_every_input() {
    let c = Corpus::bundled();
    let a = c.batch(Split::Train, 7, 3, 0, 8, 64);
    assert_eq!(a, c.batch(Split::Train, 7, 3, 0, 8, 64));
    assert_eq!(a, Corpus::bundled().batch(Split::Train, 7, 3, 0, 8, 64));
    assert_eq!(a.0.len(), 8 * 64);
    assert_eq!(a.1.len(), 8 * 64);
    assert_ne!(a, c.batch(Split::Train, 8, 3, 0, 8, 64), "seed");
    assert_ne!(a, c.batch(Split::Train, 7, 4, 0, 8, 64), "step");
    assert_ne!(a, c.batch(Split::Validation, 7, 3, 0, 8, 64), "split");
    // Sequences of one batch start at different places.
    let starts: std::collections::BTreeSet<usize> = (0..8)
        .map(|j| c.window_start(Split::Train, 7, 3, j, 64))
        .collect();
    assert_eq!(starts.len(), 8);
}

#[test]
fn a_batch_split_in_pieces_equals_the_whole() {
    let c = Corpus::bundled();
    let seq = 32;
    for split in [Split::Train, Split::Validation] {
        let (whole_in, whole_tg) = c.batch(split, 11, 5, 0, 12, seq);
        for cut in [1, 5, 11] {
            let (mut a_in, mut a_tg) = c.batch(split, 11, 5, 0, cut, seq);
            let (b_in, b_tg) = c.batch(split, 11, 5, cut, 12 - cut, seq);
            a_in.extend(b_in);
            a_tg.extend(b_tg);
            assert_eq!(a_in, whole_in);
            assert_eq!(a_tg, whole_tg);
        }
        // Three ranks with uneven shares.
        let mut pieces = Vec::new();
        for (first, count) in [(0, 3), (3, 6), (9, 3)] {
            pieces.extend(c.batch(split, 11, 5, first, count, seq).0);
        }
        assert_eq!(pieces, whole_in);
    }
}

#[test]
fn targets_are_inputs_shifted_by_one_byte() {
    let c = Corpus::bundled();
    let seq = 16;
    for split in [Split::Train, Split::Validation] {
        let (inputs, targets) = c.batch(split, 1, 0, 0, 4, seq);
        let bytes = c.split(split);
        for j in 0..4 {
            let start = c.window_start(split, 1, 0, j as u64, seq);
            let want: Vec<i32> = bytes[start..=start + seq]
                .iter()
                .map(|&b| i32::from(b))
                .collect();
            assert_eq!(&inputs[j * seq..(j + 1) * seq], &want[..seq]);
            assert_eq!(&targets[j * seq..(j + 1) * seq], &want[1..]);
            assert_eq!(
                &inputs[j * seq + 1..(j + 1) * seq],
                &targets[j * seq..(j + 1) * seq - 1]
            );
        }
        assert!(
            inputs
                .iter()
                .chain(&targets)
                .all(|&t| (0..256).contains(&t))
        );
    }
}

#[test]
fn windows_stay_inside_the_split_and_reach_its_end() {
    // A tiny split: every start in 0..len - seq_len must be reachable and the
    // last target must be the split's last byte at most.
    let c = Corpus::from_bytes("mem", (0..200u8).collect()).unwrap();
    let (len, seq) = (c.len(Split::Validation), 4);
    let mut seen = vec![false; len - seq];
    for step in 0..500 {
        let start = c.window_start(Split::Validation, 0, step, 0, seq);
        assert!(start + seq < len);
        seen[start] = true;
    }
    assert!(seen.iter().all(|&s| s), "{seen:?}");
    let (_, targets) = c.batch(Split::Validation, 0, 0, 0, 50, seq);
    assert!(targets.iter().all(|&t| (180..200).contains(&t)));
}

#[test]
fn loads_any_bytes_from_a_file() {
    let path = scratch("binary.bin");
    let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 37 % 256) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let c = Corpus::load(&path).unwrap();
    assert_eq!(c.source(), path.display().to_string());
    assert_eq!(c.total_len(), 1000);
    assert_eq!(c.split(Split::Validation), &bytes[900..]);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_missing_file_is_named() {
    let path = scratch("does-not-exist.txt");
    let err = Corpus::load(&path).unwrap_err();
    assert!(matches!(err, TrainError::Data { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(
        msg.starts_with("corpus ") && msg.contains("cannot be read"),
        "{msg}"
    );
}

#[test]
fn a_directory_is_refused_with_its_path() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let msg = Corpus::load(&dir).unwrap_err().to_string();
    assert!(msg.contains(&dir.display().to_string()), "{msg}");
}

#[test]
fn a_too_short_file_is_refused_naming_path_and_sizes() {
    let path = scratch("short.txt");
    std::fs::write(&path, b"To be.").unwrap();
    let err = Corpus::load(&path).unwrap_err();
    assert!(matches!(err, TrainError::Data { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("holds 6 bytes"), "{msg}");
    assert!(msg.contains(&MIN_BYTES.to_string()), "{msg}");
    std::fs::remove_file(&path).unwrap();
    assert!(Corpus::from_bytes("empty", Vec::new()).is_err());
    let one = Corpus::from_bytes("one", vec![b'x'])
        .unwrap_err()
        .to_string();
    assert!(one.contains("holds 1 byte, but"), "{one}");
    assert!(Corpus::from_bytes("just enough", vec![0; MIN_BYTES]).is_ok());
}

#[test]
fn too_long_a_sequence_is_refused_naming_split_and_seq_len() {
    let c = Corpus::from_bytes("little.txt", vec![b'x'; 1000]).unwrap();
    c.check_seq_len(99).unwrap();
    let msg = c.check_seq_len(100).unwrap_err().to_string();
    assert!(msg.contains("little.txt"), "{msg}");
    assert!(msg.contains("validation split holds 100 bytes"), "{msg}");
    assert!(msg.contains("seq_len 100"), "{msg}");
    let msg = c.check_seq_len(950).unwrap_err().to_string();
    assert!(msg.contains("training split holds 900 bytes"), "{msg}");
    assert!(msg.contains("seq_len 950"), "{msg}");
    assert!(c.check_seq_len(0).is_err());
    Corpus::bundled().check_seq_len(1024).unwrap();
}

#[test]
#[should_panic(expected = "check_seq_len")]
fn batch_panics_on_an_unchecked_seq_len() {
    let c = Corpus::from_bytes("little.txt", vec![b'x'; 100]).unwrap();
    let _ = c.batch(Split::Validation, 0, 0, 0, 1, 10);
}
