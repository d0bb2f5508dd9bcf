//! The transports' frames from arbitrary bytes: what a peer (or anything
//! that reached a rank's socket) sends down a TCP transport connection,
//! cut into pieces at chosen places, read by the receiving end against
//! registered regions; and the collectives' message header a peer writes,
//! as a mismatch error describes it. The reader must complete good frames,
//! refuse bad ones with a failure, never write outside a region, never
//! panic.

use polychip_comm::collectives::describe_peer_header;
use polychip_comm::tcp::fuzzing::receive;

/// One input: a byte of region count, two bytes per region length, a byte
/// of cut count and two bytes per cut, then the stream.
pub fn run(data: &[u8]) {
    let mut b = data;
    let mut take = |n: usize| {
        let (head, rest) = b.split_at(n.min(b.len()));
        b = rest;
        head.iter()
            .rev()
            .fold(0usize, |a, &x| a << 8 | usize::from(x))
    };
    let regions: Vec<usize> = (0..take(1) % 5).map(|_| take(2) * 16).collect();
    let mut cuts: Vec<usize> = (0..take(1) % 8).map(|_| take(2)).collect();
    let stream = b;
    if stream.len() >= 32 {
        let mut words = [0u64; 4];
        for (w, c) in words.iter_mut().zip(stream.chunks_exact(8)) {
            *w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        }
        let _ = describe_peer_header(&words);
    }
    cuts.retain(|&c| c < stream.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::new();
    let mut from = 0;
    for c in cuts.into_iter().chain([stream.len()]) {
        // Pieces of at most 64 KiB (what `receive` takes at once).
        while c - from > 64 << 10 {
            pieces.push(&stream[from..from + (64 << 10)]);
            from += 64 << 10;
        }
        pieces.push(&stream[from..c]);
        from = c;
    }
    let got = receive(&regions, &pieces);
    // Every frame needs a 32-byte header.
    assert!(got.frames <= (stream.len() / 32) as u64);
}
