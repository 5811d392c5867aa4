//! Array layouts from descriptors, and element orders, for the stage-out
//! checks: what numpy would make of the bytes.

use serde_json::{json, Value};

/// An array's layout from a descriptor, when it is one the npy format uses.
pub struct Layout {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub fortran: bool,
    pub itemsize: usize,
}

pub fn layout(descriptor: &[u8], data_len: usize) -> Option<Layout> {
    let v: Value = serde_json::from_slice(descriptor).ok()?;
    let dtype = v["dtype"].as_str()?.to_string();
    let shape: Vec<u64> = v["shape"]
        .as_array()?
        .iter()
        .map(Value::as_u64)
        .collect::<Option<_>>()?;
    let itemsize: usize = dtype[2..].parse().ok()?;
    let n: u64 = shape.iter().product();
    (n as usize * itemsize == data_len).then(|| Layout {
        fortran: v["order"] == "F",
        dtype,
        shape,
        itemsize,
    })
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The elements of an array stored in Fortran order, rearranged into C
/// order (what numpy's `tobytes(order="C")` gives).
pub fn c_order(data: &[u8], shape: &[u64], itemsize: usize, fortran: bool) -> Vec<u8> {
    if !fortran {
        return data.to_vec();
    }
    let dims: Vec<usize> = shape.iter().map(|d| *d as usize).collect();
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(data.len());
    for c in 0..n {
        // The multi-index of C position `c`, then its Fortran position.
        let (mut rest, mut f, mut stride) = (c, 0, 1);
        let mut idx = vec![0; dims.len()];
        for (k, d) in dims.iter().enumerate().rev() {
            idx[k] = rest % d;
            rest /= d;
        }
        for (k, d) in dims.iter().enumerate() {
            f += idx[k] * stride;
            stride *= d;
        }
        out.extend_from_slice(&data[f * itemsize..(f + 1) * itemsize]);
    }
    out
}

pub fn desc(dtype: &str, shape: &[u64], order: &str) -> Vec<u8> {
    json!({"dtype": dtype, "shape": shape, "order": order})
        .to_string()
        .into_bytes()
}

/// Bytes 0, 1, 2, ... so every element differs.
pub fn counting(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}
