//! Array payloads: the data descriptor a producer records for a numpy
//! array (`{"dtype":"<f4","shape":[..],"order":"C"}`), and the byte ranges
//! of an N-d sub-array (`a[:, 10:20, ::2]`) computed from it, so a consumer
//! fetches only the bytes of that region. Pure computation, no GIL.

use serde_json::{json, Value};
use strom_proto::selection::MAX_RANGES;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// numpy's dtype string (`<f4`, `|u1`, `<c16`, ...).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// `'C'` (row-major) or `'F'` (column-major).
    pub order: char,
}

impl Layout {
    pub fn to_descriptor(&self) -> Vec<u8> {
        let v = json!({
            "dtype": self.dtype,
            "shape": self.shape,
            "order": self.order.to_string(),
        });
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// Parses a descriptor written by `to_descriptor`; `None` if it is not one.
    pub fn parse(descriptor: &[u8]) -> Option<Layout> {
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
            "C" => 'C',
            "F" => 'F',
            _ => return None,
        };
        itemsize(&dtype)?;
        Some(Layout {
            dtype,
            shape,
            order,
        })
    }

    pub fn itemsize(&self) -> u64 {
        itemsize(&self.dtype).unwrap_or(1)
    }

    pub fn nbytes(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(self.itemsize(), |a, &d| a.checked_mul(d))
    }
}

/// Bytes per element of a numpy dtype string (`<f4` -> 4, `<M8[ns]` -> 8).
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

/// One entry of an index expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Index {
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

/// Python's `slice.indices` followed by the element count.
fn slice_indices(start: Option<i64>, stop: Option<i64>, step: i64, n: i64) -> (i64, i64, i64) {
    let (lower, upper) = if step < 0 { (-1, n - 1) } else { (0, n) };
    let clamp = |v: Option<i64>, default: i64| match v {
        None => default,
        Some(v) if v < 0 => (v + n).max(lower),
        Some(v) => v.min(upper),
    };
    let start = clamp(start, if step < 0 { upper } else { lower });
    let stop = clamp(stop, if step < 0 { lower } else { upper });
    let count = if step > 0 {
        if stop > start {
            (stop - start + step - 1) / step
        } else {
            0
        }
    } else if start > stop {
        (start - stop + (-step) - 1) / (-step)
    } else {
        0
    };
    (start, step, count)
}

/// The byte ranges of `index` applied to an array with `layout`, in the
/// order of the result's elements in memory (same order as the source),
/// adjacent ranges merged; and the result's layout.
pub fn select(layout: &Layout, index: &[Index]) -> Result<(Vec<(u64, u64)>, Layout), String> {
    let nd = layout.shape.len();
    let ellipses = index.iter().filter(|i| **i == Index::Ellipsis).count();
    if ellipses > 1 {
        return Err("an index can only have a single ellipsis ('...')".into());
    }
    let given = index.len() - ellipses;
    if given > nd {
        return Err(format!(
            "too many indices: the array is {nd}-dimensional but {given} were given"
        ));
    }
    let mut full: Vec<Index> = Vec::with_capacity(nd);
    for i in index {
        if *i == Index::Ellipsis {
            for _ in 0..nd - given {
                full.push(Index::Slice {
                    start: None,
                    stop: None,
                    step: 1,
                });
            }
        } else {
            full.push(i.clone());
        }
    }
    while full.len() < nd {
        full.push(Index::Slice {
            start: None,
            stop: None,
            step: 1,
        });
    }
    // Per dimension: first index, step and count; whether it stays in the result.
    let mut dims = Vec::with_capacity(nd);
    for (d, i) in full.iter().enumerate() {
        let n = i64::try_from(layout.shape[d]).map_err(|_| "dimension too large")?;
        match *i {
            Index::At(k) => {
                let k2 = if k < 0 { k + n } else { k };
                if k2 < 0 || k2 >= n {
                    return Err(format!(
                        "index {k} is out of bounds for axis {d} with size {n}"
                    ));
                }
                dims.push((k2, 1i64, 1i64, false));
            }
            Index::Slice { start, stop, step } => {
                if step == 0 {
                    return Err("slice step cannot be zero".into());
                }
                let (s, st, c) = slice_indices(start, stop, step, n);
                dims.push((s, st, c, true));
            }
            Index::Ellipsis => unreachable!("expanded above"),
        }
    }
    let item = layout.itemsize();
    // Byte stride of each dimension in the source.
    let mut stride = vec![0u64; nd];
    let order: Vec<usize> = if layout.order == 'F' {
        (0..nd).collect()
    } else {
        (0..nd).rev().collect()
    };
    let mut acc = item;
    for &d in &order {
        stride[d] = acc;
        acc = acc.saturating_mul(layout.shape[d]);
    }
    let out = Layout {
        dtype: layout.dtype.clone(),
        shape: dims.iter().filter(|x| x.3).map(|x| x.2 as u64).collect(),
        order: layout.order,
    };
    if dims.iter().any(|x| x.2 == 0) {
        return Ok((Vec::new(), out));
    }
    // Innermost dimensions (in memory order) that are wholly selected form
    // one contiguous block; so does a step-1 run of the next one.
    let mut block = item;
    let mut base = 0u64;
    let mut inner = 0;
    for &d in &order {
        let (s, st, c, _) = dims[d];
        if st == 1 {
            block *= c as u64;
            base += s as u64 * stride[d];
            inner += 1;
            if c as u64 != layout.shape[d] {
                break;
            }
        } else {
            break;
        }
    }
    let outer: Vec<usize> = order[inner..].iter().rev().copied().collect();
    let runs: u64 = outer.iter().map(|&d| dims[d].2 as u64).product();
    if runs > MAX_RANGES {
        return Err(format!(
            "the selection needs {runs} separate byte ranges, more than {MAX_RANGES}; select larger contiguous blocks"
        ));
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
            let (s, st, _, _) = dims[d];
            o += (s + idx[k] * st) * stride[d] as i64;
        }
        push(o as u64);
        let mut k = outer.len();
        loop {
            if k == 0 {
                break 'outer;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < dims[outer[k]].2 {
                break;
            }
            idx[k] = 0;
        }
    }
    Ok((ranges, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(shape: &[u64], order: char) -> Layout {
        Layout {
            dtype: "<i4".into(),
            shape: shape.to_vec(),
            order,
        }
    }

    #[test]
    fn whole_array_is_one_range() {
        let (r, out) = select(&l(&[2, 3, 4], 'C'), &[]).unwrap();
        assert_eq!(r, vec![(0, 96)]);
        assert_eq!(out.shape, vec![2, 3, 4]);
    }

    #[test]
    fn inner_slice_gives_one_range_per_row() {
        let idx = [
            Index::At(1),
            Index::Slice {
                start: Some(1),
                stop: Some(3),
                step: 1,
            },
        ];
        let (r, out) = select(&l(&[2, 3, 4], 'C'), &idx).unwrap();
        // rows 1 and 2 of plane 1 are adjacent: one range
        assert_eq!(r, vec![(48 + 16, 32)]);
        assert_eq!(out.shape, vec![2, 4]);
    }

    #[test]
    fn negative_steps_walk_backwards() {
        let idx = [Index::Slice {
            start: None,
            stop: None,
            step: -1,
        }];
        let (r, _) = select(&l(&[3], 'C'), &idx).unwrap();
        assert_eq!(r, vec![(8, 4), (4, 4), (0, 4)]);
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
}
