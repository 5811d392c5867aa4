//! Element types both numpy and HDF5 describe, and the mapping between
//! numpy's dtype string (what an event's array descriptor records) and an
//! HDF5 datatype, with h5py's conventions: `b1` is an 8-bit enum
//! `FALSE = 0, TRUE = 1`, `c8`/`c16` a compound of two floats named `r`
//! and `i`, `f2` IEEE half precision, `S<n>` a fixed-length string padded
//! with NULs. Byte order is kept both ways (`>i4` is `H5T_STD_I32BE`).
//!
//! Reading is strict: an HDF5 type is accepted only when its bytes are
//! exactly what the numpy dtype means (full-precision integers at offset
//! 0, IEEE float layouts, a two-member complex compound without padding);
//! anything else is [`Hdf5Error::Undescribable`] naming the class.

use std::ffi::CStr;

use hdf5_metno::Datatype;
use hdf5_sys::h5t::{self as t, H5T_class_t, H5T_order_t, H5T_sign_t};

use super::{h5, owned, Hdf5Error};

/// An element kind, without byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    Bool,
    Int {
        size: u8,
        signed: bool,
    },
    Float {
        size: u8,
    },
    /// Two floats of `size / 2` bytes each.
    Complex {
        size: u8,
    },
    /// Fixed-length bytes (`S<len>`).
    Bytes {
        len: u32,
    },
}

/// A numpy dtype Strom can write to and read from HDF5.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dtype {
    pub elem: Elem,
    pub big_endian: bool,
}

/// The largest `S<n>` accepted (HDF5 strings of this size are legal, but
/// nothing in an event needs more, and a hostile type cannot ask for more).
const MAX_BYTES_LEN: u64 = 1 << 24;

/// IEEE layouts (sign position, exponent position and size, mantissa
/// position and size, exponent bias) by size in bytes.
fn ieee(size: u8) -> Option<([usize; 5], usize)> {
    match size {
        2 => Some(([15, 10, 5, 0, 10], 15)),
        4 => Some(([31, 23, 8, 0, 23], 127)),
        8 => Some(([63, 52, 11, 0, 52], 1023)),
        _ => None,
    }
}

impl Dtype {
    /// Parses numpy's `dtype.str` (`<f8`, `|u1`, `>c16`, `|S12`, `|b1`).
    /// `=` and no mark mean this machine's order.
    pub fn parse_numpy(s: &str) -> Result<Dtype, Hdf5Error> {
        let unsupported = || Hdf5Error::UnsupportedDtype(s.to_string());
        let (mark, rest) = match s.chars().next() {
            Some(c @ ('<' | '>' | '|' | '=')) => (Some(c), &s[1..]),
            _ => (None, s),
        };
        let mut chars = rest.chars();
        let kind = chars.next().ok_or_else(unsupported)?;
        let digits = chars.as_str();
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(unsupported());
        }
        let n: u64 = digits.parse().map_err(|_| unsupported())?;
        let elem = match (kind, n) {
            ('b', 1) => Elem::Bool,
            ('i' | 'u', 1 | 2 | 4 | 8) => Elem::Int {
                size: n as u8,
                signed: kind == 'i',
            },
            ('f', 2 | 4 | 8) => Elem::Float { size: n as u8 },
            ('c', 8 | 16) => Elem::Complex { size: n as u8 },
            ('S', 1..=MAX_BYTES_LEN) => Elem::Bytes { len: n as u32 },
            _ => return Err(unsupported()),
        };
        let single = matches!(elem, Elem::Bool | Elem::Bytes { .. }) || n == 1;
        let big_endian = match mark {
            Some('>') => true,
            Some('<') => false,
            Some('|') if single => false,
            Some('|') => return Err(unsupported()),
            _ => cfg!(target_endian = "big"),
        };
        Ok(Dtype {
            elem,
            big_endian: big_endian && !single,
        })
    }

    /// numpy's `dtype.str` for this type.
    pub fn numpy(&self) -> String {
        let order = match (self.itemsize_is_one_byte(), self.big_endian) {
            (true, _) => '|',
            (false, true) => '>',
            (false, false) => '<',
        };
        match self.elem {
            Elem::Bool => "|b1".into(),
            Elem::Int { size, signed } => {
                format!("{order}{}{size}", if signed { 'i' } else { 'u' })
            }
            Elem::Float { size } => format!("{order}f{size}"),
            Elem::Complex { size } => format!("{order}c{size}"),
            Elem::Bytes { len } => format!("|S{len}"),
        }
    }

    fn itemsize_is_one_byte(&self) -> bool {
        matches!(self.elem, Elem::Bool | Elem::Bytes { .. }) || self.itemsize() == 1
    }

    /// Bytes per element.
    pub fn itemsize(&self) -> u64 {
        match self.elem {
            Elem::Bool => 1,
            Elem::Int { size, .. } | Elem::Float { size } | Elem::Complex { size } => size.into(),
            Elem::Bytes { len } => len.into(),
        }
    }

    /// A new transient HDF5 datatype for this dtype.
    pub fn to_hdf5(self) -> Result<Datatype, Hdf5Error> {
        match self.elem {
            Elem::Bool => {
                let id = h5("creating the bool enum type", || unsafe {
                    t::H5Tenum_create(*hdf5_metno::globals::H5T_NATIVE_INT8)
                })?;
                let dt = owned(id)?;
                for (name, value) in [(c"FALSE", 0i8), (c"TRUE", 1i8)] {
                    h5("adding a bool enum member", || unsafe {
                        t::H5Tenum_insert(id, name.as_ptr(), (&raw const value).cast())
                    })?;
                }
                Ok(dt)
            }
            Elem::Int { .. } | Elem::Float { size: 4 | 8 } => {
                let id = h5("copying a predefined type", || unsafe {
                    t::H5Tcopy(self.predefined())
                })?;
                owned(id)
            }
            Elem::Float { size } => {
                // Half precision, as h5py builds it: a 32-bit float cut down.
                let base = Dtype {
                    elem: Elem::Float { size: 4 },
                    big_endian: self.big_endian,
                };
                let id = h5("copying a float type", || unsafe {
                    t::H5Tcopy(base.predefined())
                })?;
                let dt = owned(id)?;
                let ([s, e, es, m, ms], bias) =
                    ieee(size).ok_or(Hdf5Error::UnsupportedDtype(self.numpy()))?;
                h5("setting half-float fields", || unsafe {
                    t::H5Tset_fields(id, s, e, es, m, ms)
                })?;
                h5("setting the half-float size", || unsafe {
                    t::H5Tset_size(id, 2)
                })?;
                h5("setting the half-float bias", || unsafe {
                    t::H5Tset_ebias(id, bias)
                })?;
                Ok(dt)
            }
            Elem::Complex { size } => {
                let half = Dtype {
                    elem: Elem::Float { size: size / 2 },
                    big_endian: self.big_endian,
                }
                .to_hdf5()?;
                let id = h5("creating the complex compound type", || unsafe {
                    t::H5Tcreate(H5T_class_t::H5T_COMPOUND, size.into())
                })?;
                let dt = owned(id)?;
                for (name, at) in [(c"r", 0), (c"i", usize::from(size / 2))] {
                    h5("adding a complex member", || unsafe {
                        t::H5Tinsert(id, name.as_ptr(), at, half.id())
                    })?;
                }
                Ok(dt)
            }
            Elem::Bytes { len } => {
                let id = h5("copying the string type", || unsafe {
                    t::H5Tcopy(*hdf5_metno::globals::H5T_C_S1)
                })?;
                let dt = owned(id)?;
                h5("setting the string size", || unsafe {
                    t::H5Tset_size(id, len as usize)
                })?;
                h5("setting the string padding", || unsafe {
                    t::H5Tset_strpad(id, t::H5T_str_t::H5T_STR_NULLPAD)
                })?;
                Ok(dt)
            }
        }
    }

    /// The predefined HDF5 type of an integer or a 4- or 8-byte float.
    fn predefined(&self) -> hdf5_sys::h5i::hid_t {
        use hdf5_metno::globals as g;
        let be = self.big_endian;
        let c = match (self.elem, be) {
            (
                Elem::Int {
                    size: 1,
                    signed: true,
                },
                _,
            ) => &g::H5T_STD_I8LE,
            (
                Elem::Int {
                    size: 1,
                    signed: false,
                },
                _,
            ) => &g::H5T_STD_U8LE,
            (
                Elem::Int {
                    size: 2,
                    signed: true,
                },
                false,
            ) => &g::H5T_STD_I16LE,
            (
                Elem::Int {
                    size: 2,
                    signed: true,
                },
                true,
            ) => &g::H5T_STD_I16BE,
            (
                Elem::Int {
                    size: 2,
                    signed: false,
                },
                false,
            ) => &g::H5T_STD_U16LE,
            (
                Elem::Int {
                    size: 2,
                    signed: false,
                },
                true,
            ) => &g::H5T_STD_U16BE,
            (
                Elem::Int {
                    size: 4,
                    signed: true,
                },
                false,
            ) => &g::H5T_STD_I32LE,
            (
                Elem::Int {
                    size: 4,
                    signed: true,
                },
                true,
            ) => &g::H5T_STD_I32BE,
            (
                Elem::Int {
                    size: 4,
                    signed: false,
                },
                false,
            ) => &g::H5T_STD_U32LE,
            (
                Elem::Int {
                    size: 4,
                    signed: false,
                },
                true,
            ) => &g::H5T_STD_U32BE,
            (Elem::Int { signed: true, .. }, false) => &g::H5T_STD_I64LE,
            (Elem::Int { signed: true, .. }, true) => &g::H5T_STD_I64BE,
            (Elem::Int { .. }, false) => &g::H5T_STD_U64LE,
            (Elem::Int { .. }, true) => &g::H5T_STD_U64BE,
            (Elem::Float { size: 8 }, false) => &g::H5T_IEEE_F64LE,
            (Elem::Float { size: 8 }, true) => &g::H5T_IEEE_F64BE,
            (_, false) => &g::H5T_IEEE_F32LE,
            (_, true) => &g::H5T_IEEE_F32BE,
        };
        **c
    }

    /// The numpy dtype of an HDF5 datatype, when its bytes mean exactly that.
    pub fn from_hdf5(dt: &Datatype) -> Result<Dtype, Hdf5Error> {
        from_id(dt.id())
    }
}

fn undescribable(what: impl Into<String>) -> Hdf5Error {
    Hdf5Error::Undescribable(what.into())
}

/// Byte order of an atomic type: `Some(big_endian)`, or `None` for VAX,
/// mixed or none.
fn order(id: hdf5_sys::h5i::hid_t) -> Result<Option<bool>, Hdf5Error> {
    let o = hdf5_metno::sync::sync(|| unsafe { t::H5Tget_order(id) });
    Ok(match o {
        H5T_order_t::H5T_ORDER_LE => Some(false),
        H5T_order_t::H5T_ORDER_BE => Some(true),
        H5T_order_t::H5T_ORDER_ERROR => return Err(undescribable("its byte order cannot be read")),
        _ => None,
    })
}

/// Size in bytes; an error for 0 (what HDF5 returns on failure).
fn size(id: hdf5_sys::h5i::hid_t) -> Result<usize, Hdf5Error> {
    h5("reading a type's size", || unsafe { t::H5Tget_size(id) })
}

/// Checks that an atomic type uses all its bits from offset 0.
fn full_precision(id: hdf5_sys::h5i::hid_t, bytes: usize, what: &str) -> Result<(), Hdf5Error> {
    let precision = h5("reading a type's precision", || unsafe {
        t::H5Tget_precision(id)
    })?;
    let offset = h5("reading a type's bit offset", || unsafe {
        t::H5Tget_offset(id)
    })?;
    if precision != bytes * 8 || offset != 0 {
        return Err(undescribable(format!(
            "{what} of {bytes} bytes with {precision} significant bits at bit offset {offset} \
             (numpy has no such type)"
        )));
    }
    Ok(())
}

fn int_from_id(id: hdf5_sys::h5i::hid_t) -> Result<Dtype, Hdf5Error> {
    let n = size(id)?;
    if !matches!(n, 1 | 2 | 4 | 8) {
        return Err(undescribable(format!("an integer of {n} bytes")));
    }
    full_precision(id, n, "an integer")?;
    let signed = match hdf5_metno::sync::sync(|| unsafe { t::H5Tget_sign(id) }) {
        H5T_sign_t::H5T_SGN_NONE => false,
        H5T_sign_t::H5T_SGN_2 => true,
        _ => return Err(undescribable("an integer of unknown sign")),
    };
    let big_endian = match (order(id)?, n) {
        (_, 1) => false,
        (Some(be), _) => be,
        (None, _) => {
            return Err(undescribable(
                "an integer that is neither little- nor big-endian",
            ))
        }
    };
    Ok(Dtype {
        elem: Elem::Int {
            size: n as u8,
            signed,
        },
        big_endian,
    })
}

fn float_from_id(id: hdf5_sys::h5i::hid_t) -> Result<Dtype, Hdf5Error> {
    let n = size(id)?;
    let Some((want, want_bias)) = u8::try_from(n).ok().and_then(ieee) else {
        return Err(undescribable(format!(
            "a float of {n} bytes (f2, f4 and f8 only)"
        )));
    };
    full_precision(id, n, "a float")?;
    let mut f = [0usize; 5];
    h5("reading a float's fields", || unsafe {
        let [s, e, es, m, ms] = &mut f;
        t::H5Tget_fields(id, s, e, es, m, ms)
    })?;
    let bias = hdf5_metno::sync::sync(|| unsafe { t::H5Tget_ebias(id) });
    if f != want || bias != want_bias {
        return Err(undescribable(format!(
            "a {n}-byte float that is not IEEE 754 (fields {f:?}, bias {bias})"
        )));
    }
    let Some(big_endian) = order(id)? else {
        return Err(undescribable(
            "a float that is neither little- nor big-endian",
        ));
    };
    Ok(Dtype {
        elem: Elem::Float { size: n as u8 },
        big_endian,
    })
}

/// A member's name, freed after copying.
fn member_name(id: hdf5_sys::h5i::hid_t, i: u32) -> Result<String, Hdf5Error> {
    hdf5_metno::sync::sync(|| unsafe {
        let p = t::H5Tget_member_name(id, i);
        if p.is_null() {
            return Err(undescribable("a member without a readable name"));
        }
        let name = CStr::from_ptr(p).to_string_lossy().into_owned();
        hdf5_sys::h5::H5free_memory(p.cast());
        Ok(name)
    })
}

fn members(id: hdf5_sys::h5i::hid_t) -> Result<u32, Hdf5Error> {
    let n = h5("reading a type's member count", || unsafe {
        t::H5Tget_nmembers(id)
    })?;
    Ok(n as u32)
}

/// h5py's bool: an enum over a 1-byte integer, exactly `FALSE = 0, TRUE = 1`.
fn enum_from_id(id: hdf5_sys::h5i::hid_t) -> Result<Dtype, Hdf5Error> {
    let base = owned(h5("reading an enum's base type", || unsafe {
        t::H5Tget_super(id)
    })?)?;
    if size(base.id())? != 1 || members(id)? != 2 {
        return Err(undescribable(
            "an enum (only h5py's bool, FALSE = 0 and TRUE = 1, maps to numpy)",
        ));
    }
    for (i, want_name, want_value) in [(0u32, "FALSE", 0u8), (1, "TRUE", 1)] {
        // The base is 1 byte, so the value is 1 byte; the buffer has room to spare.
        let mut value = [0u8; 8];
        h5("reading an enum value", || unsafe {
            t::H5Tget_member_value(id, i, value.as_mut_ptr().cast())
        })?;
        if member_name(id, i)? != want_name || value[0] != want_value {
            return Err(undescribable(
                "an enum (only h5py's bool, FALSE = 0 and TRUE = 1, maps to numpy)",
            ));
        }
    }
    Ok(Dtype {
        elem: Elem::Bool,
        big_endian: false,
    })
}

/// h5py's complex: a compound `{r: f, i: f}` of one float type, no padding.
fn compound_from_id(id: hdf5_sys::h5i::hid_t) -> Result<Dtype, Hdf5Error> {
    let not_complex =
        || undescribable("a compound type (only h5py's complex, {r, i} of one float type, maps)");
    let total = size(id)?;
    if members(id)? != 2 {
        return Err(not_complex());
    }
    let mut parts = Vec::with_capacity(2);
    for i in 0..2u32 {
        let name = member_name(id, i)?;
        let offset = hdf5_metno::sync::sync(|| unsafe { t::H5Tget_member_offset(id, i) });
        let member = owned(h5("reading a member's type", || unsafe {
            t::H5Tget_member_type(id, i)
        })?)?;
        let class = hdf5_metno::sync::sync(|| unsafe { t::H5Tget_class(member.id()) });
        if class != H5T_class_t::H5T_FLOAT {
            return Err(not_complex());
        }
        parts.push((name, offset, float_from_id(member.id())?));
    }
    let (r, i) = (&parts[0], &parts[1]);
    let names_ok = matches!((r.0.as_str(), i.0.as_str()), ("r", "i") | ("real", "imag"));
    let half = r.2.itemsize() as usize;
    if !names_ok || r.2 != i.2 || r.1 != 0 || i.1 != half || total != 2 * half || half < 4 {
        return Err(not_complex());
    }
    Ok(Dtype {
        elem: Elem::Complex {
            size: (2 * half) as u8,
        },
        big_endian: r.2.big_endian,
    })
}

fn from_id(id: hdf5_sys::h5i::hid_t) -> Result<Dtype, Hdf5Error> {
    let class = hdf5_metno::sync::sync(|| unsafe { t::H5Tget_class(id) });
    match class {
        H5T_class_t::H5T_INTEGER => int_from_id(id),
        H5T_class_t::H5T_FLOAT => float_from_id(id),
        H5T_class_t::H5T_ENUM => enum_from_id(id),
        H5T_class_t::H5T_COMPOUND => compound_from_id(id),
        H5T_class_t::H5T_STRING => {
            let variable = h5("checking for a variable-length string", || unsafe {
                t::H5Tis_variable_str(id)
            })?;
            if variable > 0 {
                return Err(undescribable(
                    "a variable-length string (numpy arrays hold fixed-size elements)",
                ));
            }
            let n = size(id)? as u64;
            if n > MAX_BYTES_LEN {
                return Err(undescribable(format!(
                    "a fixed-length string of {n} bytes (at most {MAX_BYTES_LEN})"
                )));
            }
            Ok(Dtype {
                elem: Elem::Bytes { len: n as u32 },
                big_endian: false,
            })
        }
        H5T_class_t::H5T_NO_CLASS => Err(undescribable("a type whose class cannot be read")),
        other => Err(undescribable(format!(
            "HDF5 class {} (numpy arrays of it have no fixed byte layout Strom describes)",
            class_name(other)
        ))),
    }
}

fn class_name(c: H5T_class_t) -> &'static str {
    match c {
        H5T_class_t::H5T_TIME => "time",
        H5T_class_t::H5T_BITFIELD => "bitfield",
        H5T_class_t::H5T_OPAQUE => "opaque",
        H5T_class_t::H5T_REFERENCE => "reference",
        H5T_class_t::H5T_VLEN => "variable-length sequence",
        H5T_class_t::H5T_ARRAY => "array",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_strings_round_trip() {
        for s in [
            "|b1", "|i1", "|u1", "<i2", ">i2", "<u4", ">u8", "<f2", ">f4", "<f8", "<c8", ">c16",
            "|S1", "|S300",
        ] {
            let d = Dtype::parse_numpy(s).expect(s);
            assert_eq!(d.numpy(), s);
        }
        assert_eq!(
            Dtype::parse_numpy("<i1").map(|d| d.numpy()).ok(),
            Some("|i1".into())
        );
        assert_eq!(Dtype::parse_numpy("f8").map(|d| d.itemsize()).ok(), Some(8));
    }

    #[test]
    fn dtypes_without_an_hdf5_mapping_are_refused() {
        for s in [
            "",
            "<",
            "<f",
            "<f16",
            "<c32",
            "|O8",
            "<U4",
            "<M8[ns]",
            "<m8",
            "|V4",
            "|S0",
            "<i3",
            "|i4",
            "<b2",
            "<f4x",
            "|S99999999999999999999",
        ] {
            assert!(
                matches!(Dtype::parse_numpy(s), Err(Hdf5Error::UnsupportedDtype(_))),
                "{s:?}"
            );
        }
    }

    #[test]
    fn every_dtype_maps_to_hdf5_and_back() {
        for s in [
            "|b1", "|i1", "|u1", "<i2", ">i2", "<u2", ">u4", "<i8", ">u8", "<f2", ">f2", "<f4",
            ">f4", "<f8", ">f8", "<c8", ">c16", "|S7",
        ] {
            let d = Dtype::parse_numpy(s).expect(s);
            let h = d.to_hdf5().expect(s);
            assert_eq!(h.size() as u64, d.itemsize(), "{s}");
            assert_eq!(Dtype::from_hdf5(&h).expect(s), d, "{s}");
        }
    }
}
