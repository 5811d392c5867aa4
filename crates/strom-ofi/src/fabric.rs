//! Opening libfabric objects: `fi_getinfo` with the hints an endpoint
//! needs, then fabric, domain, address vector, completion queue and an RDM
//! endpoint bound to them. [`Resources`] owns the raw handles and closes
//! them in reverse order.

use std::ffi::{CStr, CString};
use std::ptr;

use crate::error::{check, strerror};
use crate::{sys, OfiError};

/// Which provider (and optionally which domain, i.e. which NIC) to open.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProviderSpec {
    /// A libfabric provider name as `FI_PROVIDER` takes it:
    /// `"tcp;ofi_rxm"`, `"shm"`, `"verbs;ofi_rxm"`, `"cxi"`.
    pub provider: String,
    /// A domain name (`"mlx5_0"`, `"cxi0"`), or None for the first one.
    pub domain: Option<String>,
}

impl ProviderSpec {
    pub fn new(provider: &str) -> Self {
        ProviderSpec {
            provider: provider.to_string(),
            domain: None,
        }
    }

    pub fn with_domain(mut self, domain: Option<&str>) -> Self {
        self.domain = domain.map(str::to_string);
        self
    }
}

/// What the chosen provider requires of us (its `mode` and `mr_mode`) and
/// what it calls itself.
#[derive(Clone, Debug)]
pub struct Traits {
    pub provider: String,
    pub domain: String,
    /// Local buffers need a registration (`FI_MR_LOCAL`).
    pub mr_local: bool,
    /// Remote addresses are virtual addresses, not offsets (`FI_MR_VIRT_ADDR`).
    pub virt_addr: bool,
    /// The provider picks registration keys (`FI_MR_PROV_KEY`).
    pub prov_key: bool,
    /// Registrations must be bound to the endpoint (`FI_MR_ENDPOINT`).
    pub mr_endpoint: bool,
    /// Largest message or RMA transfer.
    pub max_msg: usize,
}

/// The raw objects of one endpoint. All calls on them are serialized by
/// the owner (see `endpoint`), so the provider's threading level does not
/// matter.
pub(crate) struct Resources {
    pub info: *mut sys::fi_info,
    pub fabric: *mut sys::fid_fabric,
    pub domain: *mut sys::fid_domain,
    pub av: *mut sys::fid_av,
    pub cq: *mut sys::fid_cq,
    pub ep: *mut sys::fid_ep,
}

// SAFETY: the handles are plain pointers into libfabric; every use goes
// through the endpoint's lock.
unsafe impl Send for Resources {}
unsafe impl Sync for Resources {}

fn strdup(s: &str) -> Result<*mut libc::c_char, OfiError> {
    let c = CString::new(s).map_err(|_| OfiError::Invalid(format!("NUL in name {s:?}")))?;
    // SAFETY: c is a valid C string; fi_freeinfo frees the copy.
    Ok(unsafe { libc::strdup(c.as_ptr()) })
}

/// Hints: an RDM endpoint with messages and RMA in both directions, send
/// after send ordering, the context modes and registration modes we handle.
unsafe fn hints(spec: &ProviderSpec) -> Result<*mut sys::fi_info, OfiError> {
    let h = sys::fi_allocinfo();
    if h.is_null() {
        return Err(OfiError::Invalid("fi_allocinfo returned NULL".into()));
    }
    (*h).caps = (sys::FI_MSG
        | sys::FI_RMA
        | sys::FI_READ
        | sys::FI_WRITE
        | sys::FI_REMOTE_READ
        | sys::FI_REMOTE_WRITE) as u64;
    (*h).mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
    (*(*h).ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
    (*(*h).domain_attr).mr_mode = (sys::FI_MR_LOCAL
        | sys::FI_MR_VIRT_ADDR
        | sys::FI_MR_ALLOCATED
        | sys::FI_MR_PROV_KEY
        | sys::FI_MR_ENDPOINT) as i32;
    (*(*h).tx_attr).msg_order = sys::FI_ORDER_SAS as u64;
    (*(*h).rx_attr).msg_order = sys::FI_ORDER_SAS as u64;
    (*(*h).fabric_attr).prov_name = strdup(&spec.provider)?;
    if spec.provider == "shm" {
        // shm names its region `<pid>:<endpoint>:<domain>` by default; a
        // region left behind by a dead process with the same pid (they are
        // reused) then makes fi_enable fail with EBUSY. A unique name avoids
        // that.
        let name = shm_name();
        (*h).addr_format = sys::FI_ADDR_STR;
        (*h).src_addrlen = name.len() + 1;
        (*h).src_addr = strdup(&name)?.cast();
    }
    if let Some(d) = &spec.domain {
        (*(*h).domain_attr).name = strdup(d)?;
    }
    Ok(h)
}

/// A region name no other endpoint uses: pid, time and a counter.
fn shm_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("fi_shm://strom-{}-{nanos:x}-{n}", std::process::id())
}

unsafe fn cstr(p: *const libc::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// The first `fi_info` matching `spec`.
unsafe fn getinfo(spec: &ProviderSpec) -> Result<*mut sys::fi_info, OfiError> {
    crate::dynload::api().map_err(OfiError::Unavailable)?; // loaded on first use
    let h = hints(spec)?;
    let mut info = ptr::null_mut();
    let ret = crate::dynload::fi_getinfo(
        sys::FI_VERSION_1_17,
        ptr::null(),
        ptr::null(),
        0,
        h,
        &mut info,
    );
    crate::dynload::fi_freeinfo(h);
    if ret != 0 || info.is_null() {
        return Err(OfiError::NoProvider {
            provider: spec.provider.clone(),
            domain: spec.domain.clone(),
            text: strerror(ret),
        });
    }
    Ok(info)
}

impl Resources {
    /// Opens fabric, domain, AV (table), CQ (data format) and an enabled
    /// RDM endpoint for `spec`.
    pub(crate) fn open(spec: &ProviderSpec) -> Result<(Resources, Traits), OfiError> {
        // Providers install signal handlers as they set up (shm: SIGINT,
        // to unlink its regions); the process's own are put back.
        let _kept = crate::dynload::KeptSignals::save();
        // SAFETY: standard libfabric object setup; each handle is checked
        // before use and `Resources::drop` closes whatever was opened.
        unsafe {
            let mut r = Resources {
                info: getinfo(spec)?,
                fabric: ptr::null_mut(),
                domain: ptr::null_mut(),
                av: ptr::null_mut(),
                cq: ptr::null_mut(),
                ep: ptr::null_mut(),
            };
            r.open_objects()?;
            let traits = r.traits();
            Ok((r, traits))
        }
    }

    unsafe fn open_objects(&mut self) -> Result<(), OfiError> {
        let info = self.info;
        let ret = crate::dynload::fi_fabric((*info).fabric_attr, &mut self.fabric, ptr::null_mut());
        check("fi_fabric", ret as isize)?;
        let ret = sys::fi_domain(self.fabric, info, &mut self.domain, ptr::null_mut());
        check("fi_domain", ret as isize)?;
        let mut av_attr = sys::fi_av_attr {
            type_: sys::fi_av_type_FI_AV_TABLE,
            ..Default::default()
        };
        let ret = sys::fi_av_open(self.domain, &mut av_attr, &mut self.av, ptr::null_mut());
        check("fi_av_open", ret as isize)?;
        let mut cq_attr = sys::fi_cq_attr {
            format: sys::fi_cq_format_FI_CQ_FORMAT_DATA,
            wait_obj: sys::fi_wait_obj_FI_WAIT_NONE,
            ..Default::default()
        };
        let ret = sys::fi_cq_open(self.domain, &mut cq_attr, &mut self.cq, ptr::null_mut());
        check("fi_cq_open", ret as isize)?;
        let ret = sys::fi_endpoint(self.domain, info, &mut self.ep, ptr::null_mut());
        check("fi_endpoint", ret as isize)?;
        let ret = sys::fi_ep_bind(self.ep, &mut (*self.av).fid, 0);
        check("fi_ep_bind(av)", ret as isize)?;
        let flags = (sys::FI_TRANSMIT | sys::FI_RECV) as u64;
        let ret = sys::fi_ep_bind(self.ep, &mut (*self.cq).fid, flags);
        check("fi_ep_bind(cq)", ret as isize)?;
        check("fi_enable", sys::fi_enable(self.ep) as isize)?;
        Ok(())
    }

    unsafe fn traits(&self) -> Traits {
        let info = self.info;
        let mr_mode = (*(*info).domain_attr).mr_mode as u32;
        Traits {
            provider: cstr((*(*info).fabric_attr).prov_name),
            domain: cstr((*(*info).domain_attr).name),
            mr_local: mr_mode & sys::FI_MR_LOCAL != 0,
            virt_addr: mr_mode & sys::FI_MR_VIRT_ADDR != 0,
            prov_key: mr_mode & sys::FI_MR_PROV_KEY != 0,
            mr_endpoint: mr_mode & sys::FI_MR_ENDPOINT != 0,
            max_msg: (*(*info).ep_attr).max_msg_size,
        }
    }

    /// The endpoint's address as `fi_getname` gives it.
    pub(crate) fn name(&self) -> Result<Vec<u8>, OfiError> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: buf has len bytes; fi_getname writes at most len.
        let ret =
            unsafe { sys::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr().cast(), &mut len) };
        if ret == -(sys::FI_ETOOSMALL as i32) && len > buf.len() {
            buf.resize(len, 0);
            // SAFETY: as above, with the size the provider asked for.
            let ret =
                unsafe { sys::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr().cast(), &mut len) };
            check("fi_getname", ret as isize)?;
        } else {
            check("fi_getname", ret as isize)?;
        }
        buf.truncate(len);
        Ok(buf)
    }
}

/// Closes a libfabric object if it was opened.
pub(crate) unsafe fn close(fid: *mut sys::fid) {
    if !fid.is_null() {
        sys::fi_close(fid);
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        // SAFETY: each handle is either null or open, and closed once.
        unsafe {
            if !self.ep.is_null() {
                close(&mut (*self.ep).fid);
            }
            if !self.cq.is_null() {
                close(&mut (*self.cq).fid);
            }
            if !self.av.is_null() {
                close(&mut (*self.av).fid);
            }
            if !self.domain.is_null() {
                close(&mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                close(&mut (*self.fabric).fid);
            }
            crate::dynload::fi_freeinfo(self.info);
        }
    }
}
