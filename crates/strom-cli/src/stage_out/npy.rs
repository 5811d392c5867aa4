//! NumPy `.npy` files, format version 1.0, written without numpy or any
//! crate: the magic string `\x93NUMPY`, the version bytes `1 0`, a
//! little-endian `u16` header length, then the header, a Python dict
//! literal such as `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`
//! padded with spaces and ended by `\n` so that the data starts at a
//! multiple of 64 bytes (what numpy itself writes), then the raw bytes.
//!
//! Pure std, so the integration test includes this file as a module and
//! runs its unit tests too.

/// The first six bytes of every `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// The data of a file this module writes starts at a multiple of this.
pub const ALIGN: usize = 64;
/// Magic, two version bytes and the `u16` header length.
const PREAMBLE: usize = MAGIC.len() + 2 + 2;

/// Whether `dtype` is a numpy dtype string this writer puts in a header:
/// an optional byte-order mark (`<`, `>`, `|`, `=`), a kind letter
/// (`b i u f c m M S U V`), a size in digits and, for datetimes, a unit in
/// brackets (`<M8[ns]`). Anything else (structured or object dtypes, or text
/// that would need quoting) is refused.
pub fn valid_descr(dtype: &str) -> bool {
    let s = dtype.strip_prefix(['<', '>', '|', '=']).unwrap_or(dtype);
    let mut chars = s.chars();
    let Some(kind) = chars.next() else {
        return false;
    };
    if !"biufcmMSUV".contains(kind) {
        return false;
    }
    let rest = chars.as_str();
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return false;
    }
    match &rest[digits..] {
        "" => true,
        unit => {
            matches!(kind, 'm' | 'M')
                && unit.len() > 2
                && unit.starts_with('[')
                && unit.ends_with(']')
                && unit[1..unit.len() - 1]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric())
        }
    }
}

/// The shape as a Python tuple literal: `()`, `(5,)`, `(2, 3)`.
fn shape_tuple(shape: &[u64]) -> String {
    match shape {
        [] => "()".to_string(),
        [one] => format!("({one},)"),
        dims => {
            let parts: Vec<String> = dims.iter().map(u64::to_string).collect();
            format!("({})", parts.join(", "))
        }
    }
}

/// The header dict, unpadded: keys sorted, as numpy writes them.
pub fn header_dict(dtype: &str, fortran_order: bool, shape: &[u64]) -> String {
    let order = if fortran_order { "True" } else { "False" };
    format!(
        "{{'descr': '{dtype}', 'fortran_order': {order}, 'shape': {}, }}",
        shape_tuple(shape)
    )
}

/// Everything a version 1.0 `.npy` file holds before the array's bytes:
/// magic, version, header length and the padded header. Its length is a
/// multiple of [`ALIGN`]. Errors name why the array cannot be described
/// this way (a dtype [`valid_descr`] refuses, or a header over 65,535 bytes).
pub fn preamble(dtype: &str, fortran_order: bool, shape: &[u64]) -> Result<Vec<u8>, String> {
    if !valid_descr(dtype) {
        return Err(format!(
            "dtype '{dtype}' is not a plain numpy dtype string this writer supports"
        ));
    }
    let dict = header_dict(dtype, fortran_order, shape);
    // The header ends with one '\n'; spaces before it pad to ALIGN.
    let unpadded = PREAMBLE + dict.len() + 1;
    let total = unpadded.div_ceil(ALIGN) * ALIGN;
    let header_len = total - PREAMBLE;
    let len16 = u16::try_from(header_len).map_err(|_| {
        format!("the .npy header would be {header_len} bytes, over version 1.0's 65,535")
    })?;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&len16.to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_text(p: &[u8]) -> &str {
        std::str::from_utf8(&p[PREAMBLE..]).expect("ascii header")
    }

    #[test]
    fn preamble_is_aligned_and_ends_with_a_newline() {
        for shape in [vec![], vec![5], vec![2, 3], vec![7; 30], vec![u64::MAX; 3]] {
            for dtype in ["<f4", "|u1", ">c16", "<M8[ns]", "|S12", "<U3", "|b1", "|V8"] {
                let p = preamble(dtype, false, &shape).expect("a header");
                assert_eq!(p.len() % ALIGN, 0, "{dtype} {shape:?}: length {}", p.len());
                assert_eq!(&p[..6], MAGIC);
                assert_eq!(&p[6..8], &[1, 0], "version 1.0");
                let len = u16::from_le_bytes([p[8], p[9]]) as usize;
                assert_eq!(len + PREAMBLE, p.len(), "header length field");
                assert_eq!(p.last(), Some(&b'\n'));
                assert_eq!(p.iter().filter(|b| **b == b'\n').count(), 1);
                let text = header_text(&p);
                assert!(text.trim_end().ends_with('}'), "{text:?}");
            }
        }
    }

    #[test]
    fn header_dict_has_descr_fortran_order_and_shape() {
        let p = preamble("<f4", false, &[2, 3]).expect("a header");
        assert_eq!(
            header_text(&p).trim_end(),
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
        );
        let p = preamble(">i2", true, &[4]).expect("a header");
        assert_eq!(
            header_text(&p).trim_end(),
            "{'descr': '>i2', 'fortran_order': True, 'shape': (4,), }"
        );
        let p = preamble("|u1", false, &[]).expect("a header");
        assert_eq!(
            header_text(&p).trim_end(),
            "{'descr': '|u1', 'fortran_order': False, 'shape': (), }"
        );
    }

    #[test]
    fn short_headers_take_128_bytes() {
        // 10 + len("{'descr': '|u1', 'fortran_order': False, 'shape': (), }") + 1 = 66.
        assert_eq!(preamble("|u1", false, &[]).map(|p| p.len()), Ok(128));
        assert_eq!(
            preamble("<f8", true, &[1 << 40; 3]).map(|p| p.len()),
            Ok(128)
        );
        assert_eq!(
            preamble("<f8", false, &[1 << 40; 8]).map(|p| p.len()),
            Ok(192)
        );
    }

    #[test]
    fn odd_dtypes_are_refused() {
        for bad in [
            "",
            "<",
            "<f",
            "|O",
            "<O8",
            "<f4'",
            "<f4\n",
            "[('a', '<f4')]",
            "<M8[n s]",
            "<f4[ns]",
            "<M8[]",
        ] {
            assert!(!valid_descr(bad), "{bad:?}");
        }
        assert!(valid_descr("f4"), "the byte order is optional");
        assert!(preamble("|O", false, &[1]).is_err());
    }

    #[test]
    fn a_header_over_version_1_limits_is_refused() {
        let shape = vec![u64::MAX; 4000];
        let e = preamble("<f8", false, &shape).expect_err("too long");
        assert!(e.contains("65,535"), "{e}");
    }
}
