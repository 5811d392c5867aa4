//! libfabric, loaded when the first endpoint opens instead of when the
//! process starts. Debian's libfabric links the PSM providers, whose
//! libraries install handlers for SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL
//! and SIGABRT from load-time constructors, and libfabric's providers may
//! do more when `fi_getinfo` first initializes them. Linked into libstrom
//! or the Python module, that would change how someone else's process
//! reacts to Ctrl-C or a crash before Strom was even used. So libfabric is
//! opened with `dlopen` on first use, and every signal disposition it or
//! its providers change while being loaded and initialized is put back.
//!
//! Five libfabric functions are called directly (the rest of its API goes
//! through the ops tables of its objects, or the `static inline` wrappers
//! that call them): this module resolves those five.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::sys::{fi_fabric_attr, fi_info, fid_fabric};

type GetInfo = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const fi_info,
    *mut *mut fi_info,
) -> c_int;
type Fabric = unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int;

/// The functions of libfabric called directly.
pub(crate) struct Api {
    pub getinfo: GetInfo,
    pub freeinfo: unsafe extern "C" fn(*mut fi_info),
    pub dupinfo: unsafe extern "C" fn(*const fi_info) -> *mut fi_info,
    pub fabric: Fabric,
    pub strerror: unsafe extern "C" fn(c_int) -> *const c_char,
}

/// The library's soname (the ABI the bindings were generated for).
const LIBRARY: &CStr = c"libfabric.so.1";

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// libfabric's functions, loading it on the first call; why it could not
/// be loaded otherwise.
pub(crate) fn api() -> Result<&'static Api, String> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// libfabric's functions if it is loaded already.
fn loaded() -> Option<&'static Api> {
    API.get().and_then(|r| r.as_ref().ok())
}

fn load() -> Result<Api, String> {
    let _kept = KeptSignals::save();
    // SAFETY: dlopen and dlsym with NUL-terminated names; each symbol is
    // cast to the signature of its declaration in <rdma/fabric.h>, the
    // header the bindings were generated from.
    unsafe {
        let h = libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            return Err(format!(
                "cannot load {}: {} (install libfabric: apt-get install libfabric1)",
                LIBRARY.to_string_lossy(),
                dlerror()
            ));
        }
        Ok(Api {
            getinfo: std::mem::transmute::<*mut c_void, GetInfo>(sym(h, c"fi_getinfo")?),
            freeinfo: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut fi_info)>(sym(
                h,
                c"fi_freeinfo",
            )?),
            dupinfo: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*const fi_info) -> *mut fi_info,
            >(sym(h, c"fi_dupinfo")?),
            fabric: std::mem::transmute::<*mut c_void, Fabric>(sym(h, c"fi_fabric")?),
            strerror: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(c_int) -> *const c_char,
            >(sym(h, c"fi_strerror")?),
        })
    }
}

/// `name` in the library `h`, never NULL.
unsafe fn sym(h: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
    let p = libc::dlsym(h, name.as_ptr());
    if p.is_null() {
        Err(format!(
            "{} has no {}: {}",
            LIBRARY.to_string_lossy(),
            name.to_string_lossy(),
            dlerror()
        ))
    } else {
        Ok(p)
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// Every catchable signal's disposition, put back when dropped if
/// something changed it meanwhile.
pub(crate) struct KeptSignals(Vec<(c_int, libc::sigaction)>);

impl KeptSignals {
    pub(crate) fn save() -> Self {
        let mut kept = Vec::with_capacity(31);
        for sig in 1..32 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            // SAFETY: sigaction with a NULL new action only reads.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 {
                    kept.push((sig, old));
                }
            }
        }
        KeptSignals(kept)
    }
}

impl Drop for KeptSignals {
    fn drop(&mut self) {
        for (sig, was) in &self.0 {
            // SAFETY: as above; `was` is what sigaction gave for `sig`.
            unsafe {
                let mut now: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(*sig, std::ptr::null(), &mut now) == 0
                    && (now.sa_sigaction != was.sa_sigaction || now.sa_flags != was.sa_flags)
                {
                    libc::sigaction(*sig, was, std::ptr::null_mut());
                }
            }
        }
    }
}

// The five functions libfabric exports that Strom calls directly, by the
// names of <rdma/fabric.h>; bindgen leaves them out of `sys`. Each
// returns what libfabric's own returns, or an error code if libfabric
// could not be loaded (callers load it first, through `api`).

const NOT_LOADED: ::std::os::raw::c_int = -(crate::sys::FI_ENOSYS as ::std::os::raw::c_int);

pub(crate) unsafe fn fi_getinfo(
    version: u32,
    node: *const ::std::os::raw::c_char,
    service: *const ::std::os::raw::c_char,
    flags: u64,
    hints: *const fi_info,
    info: *mut *mut fi_info,
) -> ::std::os::raw::c_int {
    match loaded() {
        Some(api) => {
            // Providers initialize on the first fi_getinfo.
            let _kept = KeptSignals::save();
            (api.getinfo)(version, node, service, flags, hints, info)
        }
        None => NOT_LOADED,
    }
}

pub(crate) unsafe fn fi_freeinfo(info: *mut fi_info) {
    if let Some(api) = loaded() {
        (api.freeinfo)(info)
    }
}

pub(crate) unsafe fn fi_fabric(
    attr: *mut fi_fabric_attr,
    fabric: *mut *mut fid_fabric,
    context: *mut ::std::os::raw::c_void,
) -> ::std::os::raw::c_int {
    match loaded() {
        Some(api) => {
            let _kept = KeptSignals::save();
            (api.fabric)(attr, fabric, context)
        }
        None => NOT_LOADED,
    }
}

pub(crate) unsafe fn fi_strerror(errnum: ::std::os::raw::c_int) -> *const ::std::os::raw::c_char {
    match loaded() {
        Some(api) => (api.strerror)(errnum),
        None => ::std::ptr::null(),
    }
}

/// `fi_dupinfo`, for the C wrapper of `fi_allocinfo` (compiled with
/// `-Dfi_dupinfo=strom_ofi_fi_dupinfo`, so that no libfabric symbol is
/// linked).
#[no_mangle]
pub unsafe extern "C" fn strom_ofi_fi_dupinfo(info: *const fi_info) -> *mut fi_info {
    match loaded() {
        Some(api) => (api.dupinfo)(info),
        None => ::std::ptr::null_mut(),
    }
}
