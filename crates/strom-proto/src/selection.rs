//! Data selections: which bytes of an event's data part a consumer fetches.
//!
//! A selection resolves, against the event's data length, to a list of byte
//! ranges. Adjacent ranges are merged so a dense selection costs one range.

use crate::message::Range;

/// Upper bound on the ranges one selection may resolve to.
pub const MAX_RANGES: u64 = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Selection {
    /// Fetch nothing (metadata only).
    #[default]
    None,
    /// Fetch the whole data part.
    All,
    /// One contiguous range.
    Range { offset: u64, len: u64 },
    /// `count` blocks of `block` bytes, starting at `offset`, `stride` apart.
    Strided {
        offset: u64,
        block: u64,
        stride: u64,
        count: u64,
    },
    /// An explicit list of `(offset, len)` ranges, fetched in the given order.
    Ranges(Vec<Range>),
}

impl Selection {
    /// Resolves to `(offset, len)` ranges within data of `data_len` bytes.
    pub fn resolve(&self, data_len: u64) -> Result<Vec<Range>, String> {
        let check = |o: u64, l: u64| -> Result<(), String> {
            match o.checked_add(l) {
                Some(end) if end <= data_len => Ok(()),
                _ => Err(format!(
                    "range at {o} of {l} bytes exceeds the event's {data_len} bytes of data"
                )),
            }
        };
        let mut out: Vec<Range> = Vec::new();
        let mut add = |o: u64, l: u64| {
            if l == 0 {
                return;
            }
            match out.last_mut() {
                Some(last) if last.0 + last.1 == o => last.1 += l,
                _ => out.push((o, l)),
            }
        };
        match self {
            Selection::None => {}
            Selection::All => add(0, data_len),
            Selection::Range { offset, len } => {
                check(*offset, *len)?;
                add(*offset, *len)
            }
            Selection::Strided {
                offset,
                block,
                stride,
                count,
            } => {
                if *count == 0 || *block == 0 {
                    return Ok(out);
                }
                if *count > MAX_RANGES {
                    return Err(format!(
                        "strided selection of {count} blocks exceeds {MAX_RANGES}"
                    ));
                }
                let last = stride
                    .checked_mul(count - 1)
                    .and_then(|s| s.checked_add(*offset))
                    .ok_or("strided selection overflows")?;
                check(last, *block)?;
                for i in 0..*count {
                    add(offset + i * stride, *block);
                }
            }
            Selection::Ranges(rs) => {
                if rs.len() as u64 > MAX_RANGES {
                    return Err(format!("{} ranges exceed {MAX_RANGES}", rs.len()));
                }
                for &(o, l) in rs {
                    check(o, l)?;
                    add(o, l);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_each_kind() {
        assert_eq!(Selection::None.resolve(10).unwrap(), vec![]);
        assert_eq!(Selection::All.resolve(10).unwrap(), vec![(0, 10)]);
        assert_eq!(Selection::All.resolve(0).unwrap(), vec![]);
        let s = Selection::Strided {
            offset: 1,
            block: 2,
            stride: 4,
            count: 3,
        };
        assert_eq!(s.resolve(11).unwrap(), vec![(1, 2), (5, 2), (9, 2)]);
        assert!(s.resolve(10).is_err());
        let dense = Selection::Strided {
            offset: 0,
            block: 4,
            stride: 4,
            count: 3,
        };
        assert_eq!(dense.resolve(12).unwrap(), vec![(0, 12)]);
        assert!(Selection::Range {
            offset: u64::MAX,
            len: 2
        }
        .resolve(10)
        .is_err());
        assert_eq!(
            Selection::Ranges(vec![(5, 1), (0, 2)]).resolve(6).unwrap(),
            vec![(5, 1), (0, 2)]
        );
    }
}
