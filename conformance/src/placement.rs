//! Where a case's tensor lives in the buffer the suite allocates for it.
//!
//! Every tensor, input or output, is a view into a one-dimensional buffer of
//! its dtype that the suite allocates itself, so the suite knows every byte
//! around it: [`GUARD`] elements before the first element the view reaches,
//! [`GUARD`] after the last, and (for layouts with gaps) the elements between
//! that the view does not reach. All of them are filled with [`GUARD_BYTE`]
//! before the call and must come back unchanged: a plugin that writes
//! outside its output, or into the gaps of a strided one, is caught even on
//! private device memory, because the suite reads the whole buffer back.
//!
//! Because of the leading guard every view also starts at a non-zero byte
//! offset into its allocation, so a plugin that ignores `byte_offset` reads
//! and writes the guard instead of the tensor.

use crate::case::Layout;

/// Guard elements before and after every tensor.
pub const GUARD: usize = 8;
/// The byte every guard element is filled with. Distinct from both poisons.
pub const GUARD_BYTE: u8 = 0x5a;

/// A view's shape and strides (in elements) and where it sits in its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Extents.
    pub shape: Vec<i64>,
    /// Strides in elements (zero or negative for some layouts).
    pub strides: Vec<i64>,
    /// Element offset of the view's origin (index 0, 0, ...) in the buffer.
    pub offset: usize,
    /// Elements in the buffer, guards included.
    pub buffer_len: usize,
}

/// Compact row-major strides of `shape`.
fn compact(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    strides
}

impl Placement {
    /// The placement of a tensor of `shape` in `layout`. Layouts that do not
    /// apply to the rank (a transposed vector, a reversed dimension that does
    /// not exist) fall back to compact.
    pub fn new(shape: &[usize], layout: Layout) -> Placement {
        let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let n = shape.len();
        let strides = match layout {
            Layout::Transposed if n >= 2 => {
                let mut stored = shape.clone();
                stored.swap(n - 2, n - 1);
                let mut strides = compact(&stored);
                strides.swap(n - 2, n - 1);
                strides
            }
            Layout::Strided if n >= 1 => {
                let mut stored = shape.clone();
                stored[n - 1] = 2 * stored[n - 1].max(1);
                let mut strides = compact(&stored);
                strides[n - 1] = 2;
                strides
            }
            Layout::RowSlice if n >= 2 => {
                // Each row is a slice of a row 3 elements wider.
                let mut stored = shape.clone();
                stored[n - 1] += 3;
                compact(&stored)
            }
            Layout::Broadcast(d) if d < n => {
                let mut stored = shape.clone();
                stored[d] = 1;
                let mut strides = compact(&stored);
                strides[d] = 0;
                strides
            }
            Layout::Reversed(d) if d < n => {
                let mut strides = compact(&shape);
                strides[d] = -strides[d];
                strides
            }
            Layout::Permuted if n >= 2 => {
                let mut stored = shape.clone();
                stored.swap(0, 1);
                let mut strides = compact(&stored);
                strides.swap(0, 1);
                strides
            }
            _ => compact(&shape),
        };
        let empty = shape.contains(&0);
        let (mut lo, mut hi) = (0i64, 0i64);
        if !empty {
            for (&e, &s) in shape.iter().zip(&strides) {
                let reach = (e - 1) * s;
                if reach < 0 {
                    lo += reach;
                } else {
                    hi += reach;
                }
            }
        }
        let span = if empty { 0 } else { (hi - lo + 1) as usize };
        Placement {
            offset: GUARD + (-lo) as usize,
            buffer_len: 2 * GUARD + span,
            shape,
            strides,
        }
    }

    /// The same view `extra` elements further into a buffer that much
    /// longer (more guard before it).
    pub fn with_lead(mut self, extra: usize) -> Placement {
        self.offset += extra;
        self.buffer_len += extra;
        self
    }

    /// Whether the view is compact: its elements are one run of the buffer.
    fn is_compact(&self) -> bool {
        self.strides == compact(&self.shape)
    }

    /// Number of elements of the view.
    fn numel(&self) -> usize {
        self.shape.iter().product::<i64>().max(0) as usize
    }

    /// The buffer position of every element of the view, in row-major order.
    pub fn positions(&self) -> Vec<usize> {
        if self.is_compact() {
            return (self.offset..self.offset + self.numel()).collect();
        }
        let numel: i64 = self.shape.iter().product();
        let mut out = Vec::with_capacity(numel.max(0) as usize);
        if numel <= 0 {
            return out;
        }
        let n = self.shape.len();
        let mut index = vec![0i64; n];
        for _ in 0..numel {
            let at: i64 = index.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
            out.push((self.offset as i64 + at) as usize);
            for d in (0..n).rev() {
                index[d] += 1;
                if index[d] < self.shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        out
    }

    /// The buffer's bytes: guard everywhere, then element `i`'s `size` bytes
    /// (from `elements`) at its position.
    pub fn fill(&self, size: usize, elements: &[u8]) -> Vec<u8> {
        let mut buffer = vec![GUARD_BYTE; self.buffer_len * size];
        if self.is_compact() {
            let start = self.offset * size;
            buffer[start..start + elements.len()].copy_from_slice(elements);
            return buffer;
        }
        for (i, p) in self.positions().into_iter().enumerate() {
            buffer[p * size..(p + 1) * size].copy_from_slice(&elements[i * size..(i + 1) * size]);
        }
        buffer
    }

    /// The elements' bytes, in row-major order, read out of a buffer.
    pub fn gather(&self, size: usize, buffer: &[u8]) -> Vec<u8> {
        if self.is_compact() {
            let start = self.offset * size;
            return buffer[start..start + self.numel() * size].to_vec();
        }
        let positions = self.positions();
        let mut out = Vec::with_capacity(positions.len() * size);
        for p in positions {
            out.extend_from_slice(&buffer[p * size..(p + 1) * size]);
        }
        out
    }

    /// Where the buffer differs from `before` outside the view's elements:
    /// the count of changed guard elements and a description of the first
    /// (relative to the view: before its start, after its end, or in a gap).
    pub fn guard_damage(
        &self,
        size: usize,
        before: &[u8],
        after: &[u8],
    ) -> Option<(usize, String)> {
        // The buffer's guard elements as runs `(from, to)`: a compact view's
        // two ends, else the runs between the positions the view reaches.
        // Each run is compared whole, and element by element only where it
        // changed (comparing every element alone was a tenth of a whole
        // conformance run).
        let (runs, first, last) = if self.is_compact() {
            let (start, end) = (self.offset, self.offset + self.numel());
            let runs = vec![(0, start), (end, self.buffer_len)];
            (runs, start, end.max(start + 1) - 1)
        } else {
            let mut covered = vec![false; self.buffer_len];
            for p in self.positions() {
                covered[p] = true;
            }
            let first = covered.iter().position(|&c| c).unwrap_or(GUARD);
            let last = covered.iter().rposition(|&c| c).unwrap_or(GUARD);
            let mut runs = Vec::new();
            let mut p = 0;
            for run in covered.chunk_by(|a, b| a == b) {
                if !run[0] {
                    runs.push((p, p + run.len()));
                }
                p += run.len();
            }
            (runs, first, last)
        };
        let same = |from: usize, to: usize| {
            before[from * size..to * size] == after[from * size..to * size]
        };
        let mut count = 0;
        let mut where_ = None;
        for (from, to) in runs {
            if same(from, to) {
                continue;
            }
            for e in (from..to).filter(|&e| !same(e, e + 1)) {
                count += 1;
                where_.get_or_insert_with(|| {
                    if e < first {
                        format!("{} element(s) before its first element", first - e)
                    } else if e > last {
                        format!("{} element(s) after its last element", e - last)
                    } else {
                        format!(
                            "in a gap between its elements ({} element(s) after its first)",
                            e - first
                        )
                    }
                });
            }
        }
        where_.map(|w| (count, w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_keeps_its_elements_inside_the_guards() {
        let layouts = [
            Layout::Contiguous,
            Layout::Transposed,
            Layout::Strided,
            Layout::RowSlice,
            Layout::Broadcast(0),
            Layout::Broadcast(1),
            Layout::Reversed(0),
            Layout::Reversed(1),
            Layout::Permuted,
        ];
        for layout in layouts {
            let p = Placement::new(&[3, 4], layout);
            let pos = p.positions();
            assert_eq!(pos.len(), 12, "{layout}");
            assert!(
                pos.iter().all(|&q| q >= GUARD && q < p.buffer_len - GUARD),
                "{layout}: {p:?}"
            );
            assert_eq!(
                *pos.iter().min().unwrap(),
                GUARD,
                "{layout}: no slack before"
            );
            assert_eq!(
                *pos.iter().max().unwrap(),
                p.buffer_len - GUARD - 1,
                "{layout}"
            );
        }
        let b = Placement::new(&[3, 4], Layout::Broadcast(0));
        assert_eq!(b.strides, vec![0, 1]);
        let r = Placement::new(&[3, 4], Layout::Reversed(0));
        assert_eq!(r.strides, vec![-4, 1]);
        assert_eq!(r.positions()[0], GUARD + 8, "row 0 is stored last");
        // [2, 3, 4] stored as [3, 2, 4]: row (i, j) starts at 4 i + 8 j, so
        // consecutive rows are not evenly spaced.
        let q = Placement::new(&[2, 3, 4], Layout::Permuted);
        assert_eq!(q.strides, vec![4, 8, 1]);
        let rows: Vec<usize> = q
            .positions()
            .iter()
            .step_by(4)
            .map(|&x| x - GUARD)
            .collect();
        assert_eq!(rows, vec![0, 8, 16, 4, 12, 20]);
        assert_eq!(
            Placement::new(&[0, 4], Layout::Strided).positions(),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn fill_and_gather_round_trip_and_guard_damage_is_located() {
        let p = Placement::new(&[2, 3], Layout::Strided);
        let elements: Vec<u8> = (0..6).collect();
        let buffer = p.fill(1, &elements);
        assert_eq!(p.gather(1, &buffer), elements);
        assert_eq!(p.guard_damage(1, &buffer, &buffer), None);
        let mut after = buffer.clone();
        after[GUARD - 1] = 0;
        after[GUARD + 1] = 0; // the gap after element 0
        let (count, first) = p.guard_damage(1, &buffer, &after).unwrap();
        assert_eq!(count, 2);
        assert!(first.contains("1 element(s) before"), "{first}");
        let mut after = buffer.clone();
        after[GUARD + 1] = 9;
        assert!(
            p.guard_damage(1, &buffer, &after)
                .unwrap()
                .1
                .contains("gap")
        );
    }

    #[test]
    fn a_compact_views_guards_are_its_two_ends_counted_by_element() {
        // Four-byte elements: one byte changed counts its element once.
        let p = Placement::new(&[3, 2], Layout::Contiguous);
        let elements: Vec<u8> = (0..24).collect();
        let buffer = p.fill(4, &elements);
        let mut after = buffer.clone();
        // Every element of the view rewritten: no damage.
        for b in &mut after[GUARD * 4..(GUARD + 6) * 4] {
            *b = 0xee;
        }
        assert_eq!(p.guard_damage(4, &buffer, &after), None);
        // Two elements after the end (one byte of each), one before.
        after[(GUARD + 6) * 4 + 3] ^= 1;
        after[(GUARD + 8) * 4] ^= 1;
        after[(GUARD - 2) * 4 + 1] ^= 1;
        let (count, first) = p.guard_damage(4, &buffer, &after).unwrap();
        assert_eq!(count, 3);
        assert!(first.contains("2 element(s) before its first"), "{first}");
        // An empty view: the whole buffer is guard.
        let empty = Placement::new(&[0, 4], Layout::Contiguous);
        let buffer = empty.fill(2, &[]);
        let mut after = buffer.clone();
        *after.last_mut().unwrap() ^= 1;
        assert_eq!(empty.guard_damage(2, &buffer, &after).unwrap().0, 1);
    }
}
