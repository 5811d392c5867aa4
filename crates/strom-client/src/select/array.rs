//! Array payloads: the data descriptor a producer records for an N-d array
//! (`{"dtype":"<f4","shape":[..],"order":"C"}`, numpy's vocabulary), and
//! the byte ranges of an N-d sub-array (`a[:, 10:20, ::2]`) computed from
//! it, so a consumer fetches only the bytes of that region. Pure
//! computation: no I/O, no knowledge of the consumer.

use std::fmt;

use serde_json::{json, Value};
use strom_proto::selection::MAX_RANGES;

/// Memory order of an array's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Row-major: the last index varies fastest.
    C,
    /// Column-major: the first index varies fastest.
    F,
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Order::C => "C",
            Order::F => "F",
        })
    }
}

/// The element type, shape and memory order of an array payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayLayout {
    /// numpy's dtype string (`<f4`, `|u1`, `<c16`, ...).
    pub dtype: String,
    pub shape: Vec<u64>,
    pub order: Order,
}

/// Why an index cannot be applied to an array.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArrayError {
    #[error("an index can only have a single ellipsis ('...')")]
    MultipleEllipses,
    #[error("too many indices: the array is {dims}-dimensional but {given} were given")]
    TooManyIndices { dims: usize, given: usize },
    #[error("index {index} is out of bounds for axis {axis} with size {size}")]
    OutOfBounds { index: i64, axis: usize, size: u64 },
    #[error("slice step cannot be zero")]
    ZeroStep,
    #[error("the array's {0:?} shape does not fit in addressable bytes")]
    TooLarge(Vec<u64>),
    #[error("the selection needs {0} separate byte ranges, more than {MAX_RANGES}; select larger contiguous blocks")]
    TooManyRanges(u64),
}

/// One entry of an index expression, with numpy's basic-indexing meaning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AxisIndex {
    /// `start:stop:step` with Python semantics (negative counts from the end).
    Slice {
        start: Option<i64>,
        stop: Option<i64>,
        step: i64,
    },
    /// A single position; the dimension is dropped from the result.
    At(i64),
    /// `...`: as many full slices as needed.
    Ellipsis,
}

impl AxisIndex {
    /// `:`, the whole axis.
    pub const FULL: AxisIndex = AxisIndex::Slice {
        start: None,
        stop: None,
        step: 1,
    };
}

/// The bytes of a sub-array and the layout they form once fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubArray {
    /// `(offset, length)` byte ranges in the order of the result's elements
    /// in memory (the source's order), adjacent ranges merged.
    pub ranges: Vec<(u64, u64)>,
    /// The layout of the concatenated ranges.
    pub layout: ArrayLayout,
}

impl ArrayLayout {
    /// The descriptor a producer records with an array payload.
    pub fn to_descriptor(&self) -> Vec<u8> {
        let v = json!({
            "dtype": self.dtype,
            "shape": self.shape,
            "order": self.order.to_string(),
        });
        // A `Value` always serializes.
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// Parses a descriptor written by [`to_descriptor`](Self::to_descriptor);
    /// `None` if it is not one (any other blob a producer attached).
    pub fn parse(descriptor: &[u8]) -> Option<ArrayLayout> {
        if descriptor.first() != Some(&b'{') {
            return None;
        }
        let v: Value = serde_json::from_slice(descriptor).ok()?;
        let dtype = v.get("dtype")?.as_str()?.to_string();
        let shape = v
            .get("shape")?
            .as_array()?
            .iter()
            .map(Value::as_u64)
            .collect::<Option<Vec<u64>>>()?;
        let order = match v.get("order").and_then(Value::as_str).unwrap_or("C") {
            "C" => Order::C,
            "F" => Order::F,
            _ => return None,
        };
        itemsize(&dtype)?;
        Some(ArrayLayout {
            dtype,
            shape,
            order,
        })
    }

    /// Bytes per element (1 for a dtype [`itemsize`] does not know).
    pub fn itemsize(&self) -> u64 {
        itemsize(&self.dtype).unwrap_or(1)
    }

    /// Size of the whole array in bytes; `None` on overflow.
    pub fn nbytes(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(self.itemsize(), |a, &d| a.checked_mul(d))
    }

    /// The byte ranges of `index` applied to an array with this layout, and
    /// the layout of the result.
    pub fn select(&self, index: &[AxisIndex]) -> Result<SubArray, ArrayError> {
        select(self, index)
    }
}

/// Bytes per element of a numpy dtype string (`<f4` -> 4, `<M8[ns]` -> 8);
/// `None` for object and unsized types.
pub fn itemsize(dtype: &str) -> Option<u64> {
    let s = dtype.trim_start_matches(['<', '>', '|', '=']);
    let mut chars = s.chars();
    let kind = chars.next()?;
    if !"biufcmMOSUV?".contains(kind) || kind == 'O' {
        return None;
    }
    let digits: String = chars.take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().ok()?;
    if kind == 'U' {
        n.checked_mul(4)
    } else {
        Some(n)
    }
}

/// Python's `slice.indices` followed by the element count.
fn slice_indices(start: Option<i64>, stop: Option<i64>, step: i64, n: i64) -> (i64, i64, i64) {
    let (lower, upper) = if step < 0 { (-1, n - 1) } else { (0, n) };
    let clamp = |v: Option<i64>, default: i64| match v {
        None => default,
        Some(v) if v < 0 => v.saturating_add(n).max(lower),
        Some(v) => v.min(upper),
    };
    let start = clamp(start, if step < 0 { upper } else { lower });
    let stop = clamp(stop, if step < 0 { lower } else { upper });
    // In i128: `step` may be i64::MIN or MAX.
    let (span, by) = if step > 0 {
        (stop as i128 - start as i128, step as i128)
    } else {
        (start as i128 - stop as i128, -(step as i128))
    };
    let count = if span > 0 { (span + by - 1) / by } else { 0 };
    (start, step, count as i64)
}

/// One dimension of a selection: first index, step, count, and whether
/// the dimension stays in the result (an integer index drops it).
#[derive(Clone, Copy)]
struct Dim {
    start: i64,
    step: i64,
    count: i64,
    kept: bool,
}

/// `index` with the ellipsis expanded and trailing full slices added, one
/// entry per dimension of an `nd`-dimensional array.
fn expand(index: &[AxisIndex], nd: usize) -> Result<Vec<AxisIndex>, ArrayError> {
    let ellipses = index.iter().filter(|i| **i == AxisIndex::Ellipsis).count();
    if ellipses > 1 {
        return Err(ArrayError::MultipleEllipses);
    }
    let given = index.len() - ellipses;
    if given > nd {
        return Err(ArrayError::TooManyIndices { dims: nd, given });
    }
    let mut full: Vec<AxisIndex> = Vec::with_capacity(nd);
    for i in index {
        if *i == AxisIndex::Ellipsis {
            full.extend(std::iter::repeat_n(AxisIndex::FULL, nd - given));
        } else {
            full.push(i.clone());
        }
    }
    full.resize(nd, AxisIndex::FULL);
    Ok(full)
}

fn select(layout: &ArrayLayout, index: &[AxisIndex]) -> Result<SubArray, ArrayError> {
    let too_large = || ArrayError::TooLarge(layout.shape.clone());
    // Every byte offset below fits in an i64 once the whole array does.
    if layout.nbytes().is_none_or(|n| n > i64::MAX as u64) {
        return Err(too_large());
    }
    let nd = layout.shape.len();
    let full = expand(index, nd)?;
    let mut dims = Vec::with_capacity(nd);
    for (axis, i) in full.iter().enumerate() {
        let size = layout.shape[axis];
        let n = i64::try_from(size).map_err(|_| too_large())?;
        match *i {
            AxisIndex::At(k) => {
                let k2 = if k < 0 { k.saturating_add(n) } else { k };
                if k2 < 0 || k2 >= n {
                    return Err(ArrayError::OutOfBounds {
                        index: k,
                        axis,
                        size,
                    });
                }
                dims.push(Dim {
                    start: k2,
                    step: 1,
                    count: 1,
                    kept: false,
                });
            }
            AxisIndex::Slice { start, stop, step } => {
                if step == 0 {
                    return Err(ArrayError::ZeroStep);
                }
                let (start, step, count) = slice_indices(start, stop, step, n);
                dims.push(Dim {
                    start,
                    step,
                    count,
                    kept: true,
                });
            }
            AxisIndex::Ellipsis => unreachable!("expanded above"),
        }
    }
    let item = layout.itemsize();
    // Dimensions from the fastest-varying in memory to the slowest, and
    // the byte stride of each in the source.
    let order: Vec<usize> = match layout.order {
        Order::F => (0..nd).collect(),
        Order::C => (0..nd).rev().collect(),
    };
    let mut stride = vec![0u64; nd];
    let mut acc = item;
    for &d in &order {
        stride[d] = acc;
        acc = acc.saturating_mul(layout.shape[d]);
    }
    let out = ArrayLayout {
        dtype: layout.dtype.clone(),
        shape: dims
            .iter()
            .filter(|x| x.kept)
            .map(|x| x.count as u64)
            .collect(),
        order: layout.order,
    };
    if dims.iter().any(|x| x.count == 0) {
        return Ok(SubArray {
            ranges: Vec::new(),
            layout: out,
        });
    }
    // Innermost dimensions (in memory order) that are wholly selected form
    // one contiguous block; so does a step-1 run of the next one.
    let mut block = item;
    let mut base = 0u64;
    let mut inner = 0;
    for &d in &order {
        let x = dims[d];
        if x.step != 1 {
            break;
        }
        block *= x.count as u64;
        base += x.start as u64 * stride[d];
        inner += 1;
        if x.count as u64 != layout.shape[d] {
            break;
        }
    }
    let outer: Vec<usize> = order[inner..].iter().rev().copied().collect();
    let runs = outer
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(dims[d].count as u64))
        .unwrap_or(u64::MAX);
    if runs > MAX_RANGES {
        return Err(ArrayError::TooManyRanges(runs));
    }
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut push = |o: u64| match ranges.last_mut() {
        Some(last) if last.0 + last.1 == o => last.1 += block,
        _ => ranges.push((o, block)),
    };
    // Odometer over the outer dimensions, outermost first.
    let mut idx = vec![0i64; outer.len()];
    'outer: loop {
        let mut o = base as i64;
        for (k, &d) in outer.iter().enumerate() {
            let x = dims[d];
            o += (x.start + idx[k] * x.step) * stride[d] as i64;
        }
        push(o as u64);
        let mut k = outer.len();
        loop {
            if k == 0 {
                break 'outer;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < dims[outer[k]].count {
                break;
            }
            idx[k] = 0;
        }
    }
    Ok(SubArray {
        ranges,
        layout: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(shape: &[u64], order: Order) -> ArrayLayout {
        ArrayLayout {
            dtype: "<i4".into(),
            shape: shape.to_vec(),
            order,
        }
    }

    fn slice(start: Option<i64>, stop: Option<i64>, step: i64) -> AxisIndex {
        AxisIndex::Slice { start, stop, step }
    }

    #[test]
    fn whole_array_is_one_range() {
        let s = l(&[2, 3, 4], Order::C).select(&[]).unwrap();
        assert_eq!(s.ranges, vec![(0, 96)]);
        assert_eq!(s.layout.shape, vec![2, 3, 4]);
    }

    #[test]
    fn inner_slice_gives_one_range_per_row() {
        let idx = [AxisIndex::At(1), slice(Some(1), Some(3), 1)];
        let s = l(&[2, 3, 4], Order::C).select(&idx).unwrap();
        // rows 1 and 2 of plane 1 are adjacent: one range
        assert_eq!(s.ranges, vec![(48 + 16, 32)]);
        assert_eq!(s.layout.shape, vec![2, 4]);
    }

    #[test]
    fn negative_steps_walk_backwards() {
        let s = l(&[3], Order::C).select(&[slice(None, None, -1)]).unwrap();
        assert_eq!(s.ranges, vec![(8, 4), (4, 4), (0, 4)]);
    }

    #[test]
    fn itemsizes() {
        assert_eq!(itemsize("<f4"), Some(4));
        assert_eq!(itemsize("|u1"), Some(1));
        assert_eq!(itemsize("<c16"), Some(16));
        assert_eq!(itemsize("<M8[ns]"), Some(8));
        assert_eq!(itemsize("<U3"), Some(12));
        assert_eq!(itemsize("|O"), None);
    }

    #[test]
    fn descriptor_round_trips_and_rejects_other_blobs() {
        let a = ArrayLayout {
            dtype: "<f8".into(),
            shape: vec![4, 0, 7],
            order: Order::F,
        };
        assert_eq!(ArrayLayout::parse(&a.to_descriptor()), Some(a));
        assert_eq!(ArrayLayout::parse(b"raw bytes"), None);
        assert_eq!(ArrayLayout::parse(br#"{"dtype":"|O","shape":[1]}"#), None);
        assert_eq!(
            ArrayLayout::parse(br#"{"dtype":"<i2","shape":[3]}"#).map(|l| l.order),
            Some(Order::C)
        );
    }

    #[test]
    fn bad_indexes_are_refused_with_their_reason() {
        let a = l(&[2, 3], Order::C);
        let e = |i: &[AxisIndex]| a.select(i).unwrap_err();
        assert_eq!(
            e(&[AxisIndex::At(5)]),
            ArrayError::OutOfBounds {
                index: 5,
                axis: 0,
                size: 2
            }
        );
        assert!(matches!(
            e(&[AxisIndex::At(-3)]),
            ArrayError::OutOfBounds { index: -3, .. }
        ));
        assert_eq!(
            e(&[AxisIndex::At(0), AxisIndex::At(0), AxisIndex::At(0)]),
            ArrayError::TooManyIndices { dims: 2, given: 3 }
        );
        assert_eq!(
            e(&[AxisIndex::Ellipsis, AxisIndex::Ellipsis]),
            ArrayError::MultipleEllipses
        );
        assert_eq!(e(&[slice(None, None, 0)]), ArrayError::ZeroStep);
        let huge = l(&[u64::MAX, 2], Order::C);
        assert!(matches!(huge.select(&[]), Err(ArrayError::TooLarge(_))));
    }

    #[test]
    fn too_many_ranges_are_refused_before_any_is_built() {
        let a = ArrayLayout {
            dtype: "|u1".into(),
            shape: vec![1 << 11, 1 << 11],
            order: Order::C,
        };
        let every_other_column = [AxisIndex::FULL, slice(None, None, 2)];
        assert_eq!(
            a.select(&every_other_column),
            Err(ArrayError::TooManyRanges(1 << 21))
        );
    }

    #[test]
    fn extreme_slice_bounds_clamp_like_python() {
        let a = l(&[5], Order::C);
        let s = a
            .select(&[slice(Some(i64::MIN), Some(i64::MAX), i64::MAX)])
            .unwrap();
        assert_eq!(s.ranges, vec![(0, 4)]);
        let s = a.select(&[slice(None, None, i64::MIN)]).unwrap();
        assert_eq!(s.ranges, vec![(16, 4)]);
    }

    /// A tiny deterministic generator (xorshift64*), so the comparison
    /// below covers many shapes and indexes without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn bound(&mut self, n: i64) -> Option<i64> {
            match self.below(4) {
                0 => None,
                _ => Some(self.below(2 * n as u64 + 5) as i64 - n - 2),
            }
        }
    }

    /// The positions `start:stop:step` takes on an axis of `n`, written as
    /// Python's documentation states it, element by element.
    fn reference_positions(start: Option<i64>, stop: Option<i64>, step: i64, n: i64) -> Vec<i64> {
        let mut out = Vec::new();
        if step > 0 {
            let norm = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
            let (mut i, end) = (start.map_or(0, norm), stop.map_or(n, norm));
            while i < end {
                out.push(i);
                i += step;
            }
        } else {
            let norm = |v: i64| if v < 0 { (v + n).max(-1) } else { v.min(n - 1) };
            let (mut i, end) = (start.map_or(n - 1, norm), stop.map_or(-1, norm));
            while i > end {
                out.push(i);
                i += step;
            }
        }
        out
    }

    /// The bytes of `a[index]` copied element by element, in the order of
    /// the result's elements in memory, and the result's shape.
    fn reference_copy(
        src: &[u8],
        layout: &ArrayLayout,
        index: &[AxisIndex],
    ) -> (Vec<u8>, Vec<u64>) {
        let nd = layout.shape.len();
        let full = expand(index, nd).unwrap();
        let positions: Vec<Vec<i64>> = full
            .iter()
            .zip(&layout.shape)
            .map(|(i, &n)| match *i {
                AxisIndex::At(k) => vec![if k < 0 { k + n as i64 } else { k }],
                AxisIndex::Slice { start, stop, step } => {
                    reference_positions(start, stop, step, n as i64)
                }
                AxisIndex::Ellipsis => unreachable!(),
            })
            .collect();
        let kept: Vec<usize> = (0..nd)
            .filter(|&d| !matches!(full[d], AxisIndex::At(_)))
            .collect();
        let shape: Vec<u64> = kept.iter().map(|&d| positions[d].len() as u64).collect();
        let item = layout.itemsize() as usize;
        // Flat element number of a source multi-index.
        let flat = |ix: &[i64]| -> usize {
            let mut f = 0usize;
            let dims: Vec<usize> = match layout.order {
                Order::C => (0..nd).collect(),
                Order::F => (0..nd).rev().collect(),
            };
            for d in dims {
                f = f * layout.shape[d] as usize + ix[d] as usize;
            }
            f
        };
        let mut out = Vec::new();
        let total: usize = positions.iter().map(Vec::len).product();
        // Walk the result's elements in its memory order.
        let walk: Vec<usize> = match layout.order {
            Order::C => (0..nd).rev().collect(),
            Order::F => (0..nd).collect(),
        };
        let mut counter = vec![0usize; nd];
        for _ in 0..total {
            let ix: Vec<i64> = (0..nd).map(|d| positions[d][counter[d]]).collect();
            let e = flat(&ix) * item;
            out.extend_from_slice(&src[e..e + item]);
            for &d in &walk {
                counter[d] += 1;
                if counter[d] < positions[d].len() {
                    break;
                }
                counter[d] = 0;
            }
        }
        (out, shape)
    }

    #[test]
    fn sub_arrays_match_an_element_by_element_copy() {
        let mut rng = Rng(0x005e_ed0f_5707);
        for case in 0..3000 {
            let nd = rng.below(5) as usize;
            let shape: Vec<u64> = (0..nd).map(|_| rng.below(6)).collect();
            let dtype = ["|u1", "<i2", "<f4", "<c16"][rng.below(4) as usize];
            let layout = ArrayLayout {
                dtype: dtype.into(),
                shape: shape.clone(),
                order: if rng.below(2) == 0 {
                    Order::C
                } else {
                    Order::F
                },
            };
            let n = layout.nbytes().unwrap() as usize;
            // Every byte distinct enough that a misplaced element shows.
            let src: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8).collect();
            // Indexes for the first `m` axes, maybe followed by `...`, or
            // `...` followed by indexes for the last `m` axes.
            let m = rng.below(nd as u64 + 1) as usize;
            let mode = rng.below(3);
            let axes = if mode == 2 { nd - m..nd } else { 0..m };
            let mut index: Vec<AxisIndex> = shape[axes]
                .iter()
                .map(|&size| {
                    let size = size as i64;
                    if size > 0 && rng.below(4) == 0 {
                        AxisIndex::At(rng.below(2 * size as u64) as i64 - size)
                    } else {
                        let step = [1, 1, 2, 3, -1, -2, 7][rng.below(7) as usize];
                        slice(rng.bound(size), rng.bound(size), step)
                    }
                })
                .collect();
            match mode {
                1 => index.push(AxisIndex::Ellipsis),
                2 => index.insert(0, AxisIndex::Ellipsis),
                _ => {}
            }
            let got = layout
                .select(&index)
                .unwrap_or_else(|e| panic!("case {case}: {layout:?}[{index:?}] failed: {e}"));
            let fetched: Vec<u8> = got
                .ranges
                .iter()
                .flat_map(|&(o, len)| src[o as usize..(o + len) as usize].iter().copied())
                .collect();
            let (want, want_shape) = reference_copy(&src, &layout, &index);
            assert_eq!(
                got.layout.shape, want_shape,
                "case {case}: {layout:?}[{index:?}]"
            );
            assert_eq!(fetched, want, "case {case}: {layout:?}[{index:?}]");
            assert_eq!(got.layout.nbytes(), Some(want.len() as u64));
            assert!(
                got.ranges.windows(2).all(|w| w[0].0 + w[0].1 != w[1].0),
                "case {case}: adjacent ranges were not merged: {:?}",
                got.ranges
            );
        }
    }
}
