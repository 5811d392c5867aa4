//! Drivers and topics: connecting to a group (or starting a server inside
//! the process), and creating, opening and deleting topics.

use std::ffi::{c_char, CString};

use strom_client::{Driver, Durability, Overflow, PartitionType, Topic, TopicSpec};

use crate::status::{
    guard, opt_str_arg, out_arg, put, str_arg, strom_status, Fail, FfiResult,
    STROM_ERR_INVALID_ARGUMENT,
};

/// A connection to a Strom group, or a server running in this process.
/// Thread-safe. Free it with `strom_driver_free` after every topic,
/// producer and consumer made from it (they keep its runtime alive anyway).
pub struct strom_driver {
    pub(crate) inner: Driver,
    master: CString,
}

/// A topic of a driver. Thread-safe; free with `strom_topic_free`.
pub struct strom_topic {
    pub(crate) inner: Topic,
    name: CString,
}

/// How to create a topic. Fill it with `strom_topic_spec_init`, then
/// change what you need. Every string is borrowed for the duration of
/// `strom_topic_create` only; NULL strings and zero numbers mean the
/// server's default.
#[repr(C)]
pub struct strom_topic_spec {
    pub name: *const c_char,
    pub partitions: u32,
    /// `"file"` (default, persistent) or `"memory"`.
    pub partition_type: *const c_char,
    /// `"always"` (default), `"never"` or `"interval:<ms>"`.
    pub durability: *const c_char,
    /// `"none"` (default), `"json"` or `"json-schema"` (with `schema`).
    pub validator: *const c_char,
    /// An inline JSON schema, for `json-schema` and the `binary` serializer.
    pub schema: *const c_char,
    /// The partition selector: `"round-robin"` (default), `"hash:<field>"`
    /// or `"explicit"`.
    pub selector: *const c_char,
    /// `"json"` (default) or `"binary"`.
    pub serializer: *const c_char,
    /// Memory partitions when full: `"block"` (default) or `"drop-oldest"`.
    pub overflow: *const c_char,
    pub retention_bytes: u64,
    pub retention_ms: u64,
    pub segment_bytes: u64,
}

/// Fills `spec` with the defaults for a topic `name` of `partitions`
/// partitions. `name` is borrowed, not copied.
#[no_mangle]
pub unsafe extern "C" fn strom_topic_spec_init(
    spec: *mut strom_topic_spec,
    name: *const c_char,
    partitions: u32,
) -> strom_status {
    guard(|| {
        let spec = out_arg(spec, "spec")?;
        put(
            spec,
            strom_topic_spec {
                name,
                partitions,
                partition_type: std::ptr::null(),
                durability: std::ptr::null(),
                validator: std::ptr::null(),
                schema: std::ptr::null(),
                selector: std::ptr::null(),
                serializer: std::ptr::null(),
                overflow: std::ptr::null(),
                retention_bytes: 0,
                retention_ms: 0,
                segment_bytes: 0,
            },
        );
        Ok(())
    })
}

unsafe fn to_spec(s: &strom_topic_spec) -> FfiResult<TopicSpec> {
    let bad = |e: String| Fail::new(STROM_ERR_INVALID_ARGUMENT, e);
    let mut spec = TopicSpec::new(str_arg(s.name, "spec.name")?, s.partitions);
    if let Some(t) = opt_str_arg(s.partition_type, "spec.partition_type")? {
        spec.partition_type = PartitionType::parse(t).map_err(bad)?;
    }
    if let Some(d) = opt_str_arg(s.durability, "spec.durability")? {
        spec.durability = Durability::parse(d).map_err(bad)?;
    }
    if let Some(v) = opt_str_arg(s.validator, "spec.validator")? {
        spec.validator = v.into();
    }
    spec.schema = opt_str_arg(s.schema, "spec.schema")?.map(Into::into);
    if let Some(v) = opt_str_arg(s.selector, "spec.selector")? {
        spec.selector = v.into();
    }
    if let Some(v) = opt_str_arg(s.serializer, "spec.serializer")? {
        spec.serializer = v.into();
    }
    if let Some(o) = opt_str_arg(s.overflow, "spec.overflow")? {
        spec.overflow = Some(Overflow::parse(o).map_err(bad)?);
    }
    let nonzero = |v: u64| (v > 0).then_some(v);
    spec.retention_bytes = nonzero(s.retention_bytes);
    spec.retention_ms = nonzero(s.retention_ms);
    spec.segment_bytes = nonzero(s.segment_bytes);
    Ok(spec)
}

fn new_driver(d: Driver, out: *mut *mut strom_driver) -> FfiResult {
    let master = CString::new(d.master_addr()).unwrap_or_default();
    unsafe {
        put(
            out,
            Box::into_raw(Box::new(strom_driver { inner: d, master })),
        )
    };
    Ok(())
}

/// Connects to the group described by a group file (as `strom server`
/// writes it). On success `*out` is a new driver.
#[no_mangle]
pub unsafe extern "C" fn strom_driver_connect(
    group_file: *const c_char,
    out: *mut *mut strom_driver,
) -> strom_status {
    guard(|| {
        let path = str_arg(group_file, "group_file")?;
        let out = out_arg(out, "out")?;
        new_driver(Driver::connect(path)?, out)
    })
}

/// Connects to the group whose registry master listens at `addr`
/// (`host:port`, as `strom_driver_master_addr` prints it).
#[no_mangle]
pub unsafe extern "C" fn strom_driver_connect_addr(
    addr: *const c_char,
    out: *mut *mut strom_driver,
) -> strom_status {
    guard(|| {
        let addr = str_arg(addr, "addr")?;
        let out = out_arg(out, "out")?;
        new_driver(Driver::connect_addr(addr)?, out)
    })
}

/// Starts a Strom server inside this process, with its data under
/// `data_dir` and listening on 127.0.0.1 (a free port), and connects to it.
/// Other processes reach it at `strom_driver_master_addr`. It stops when
/// the driver and everything made from it are freed. The server stands
/// alone even inside an MPI or Slurm job (it ignores the launcher's rank
/// variables, which `strom server` uses to form a group).
#[no_mangle]
pub unsafe extern "C" fn strom_driver_embedded(
    data_dir: *const c_char,
    out: *mut *mut strom_driver,
) -> strom_status {
    guard(|| {
        let dir = str_arg(data_dir, "data_dir")?;
        let out = out_arg(out, "out")?;
        new_driver(Driver::embedded(dir)?, out)
    })
}

/// How to start a server inside this process with
/// `strom_driver_embedded_ex`. Fill with `strom_server_options_init`.
/// Every string is borrowed for the duration of the call; NULL means the
/// default.
#[repr(C)]
pub struct strom_server_options {
    /// The server's data directory (required).
    pub data_dir: *const c_char,
    /// The address to listen on (default `127.0.0.1:0`: loopback, a free
    /// port). Other members reach the server here.
    pub listen: *const c_char,
    /// More addresses to serve clients on, comma-separated (for example
    /// `shm://auto`).
    pub also_listen: *const c_char,
    /// Start a new group and write its group file here (and the cluster
    /// secret beside it, `<file>.secret`, readable by this user only).
    pub group_file: *const c_char,
    /// Join the running group this group file describes, as a new member.
    pub join: *const c_char,
    /// With `join`: the group's cluster secret (default: beside `join`).
    pub cluster_secret_file: *const c_char,
    /// Non-zero: serve a network (non-loopback) address without
    /// authentication (`strom server --insecure`, docs/security.md).
    pub insecure: i32,
}

/// Fills `opts` with the defaults for a server with its data in `data_dir`
/// (borrowed, not copied).
#[no_mangle]
pub unsafe extern "C" fn strom_server_options_init(
    opts: *mut strom_server_options,
    data_dir: *const c_char,
) -> strom_status {
    guard(|| {
        let opts = out_arg(opts, "opts")?;
        *opts = strom_server_options {
            data_dir,
            listen: std::ptr::null(),
            also_listen: std::ptr::null(),
            group_file: std::ptr::null(),
            join: std::ptr::null(),
            cluster_secret_file: std::ptr::null(),
            insecure: 0,
        };
        Ok(())
    })
}

/// Starts a Strom server inside this process as `opts` says, and connects
/// to the group through it: a new group of its own, or a member of the
/// group `opts->join` names. It stops when the driver and everything made
/// from it are freed. Like `strom_driver_embedded`, it ignores the
/// launcher's rank variables.
#[no_mangle]
pub unsafe extern "C" fn strom_driver_embedded_ex(
    opts: *const strom_server_options,
    out: *mut *mut strom_driver,
) -> strom_status {
    guard(|| {
        let opts = opts.as_ref().ok_or_else(|| Fail::null("opts"))?;
        let out = out_arg(out, "out")?;
        new_driver(Driver::embedded_with(server_config(opts)?)?, out)
    })
}

unsafe fn server_config(o: &strom_server_options) -> FfiResult<strom_client::ServerConfig> {
    let path = |p, what| opt_str_arg(p, what).map(|s| s.map(std::path::PathBuf::from));
    let mut c = strom_client::ServerConfig {
        data_dir: str_arg(o.data_dir, "data_dir")?.into(),
        group_file: path(o.group_file, "group_file")?,
        join: path(o.join, "join")?,
        cluster_secret_file: path(o.cluster_secret_file, "cluster_secret_file")?,
        insecure: o.insecure != 0,
        ..Default::default()
    };
    if c.join.is_none() {
        // A new group of one, whatever a launcher's environment says.
        (c.rank, c.size) = (Some(0), Some(1));
    }
    if let Some(l) = opt_str_arg(o.listen, "listen")? {
        c.listen = l.to_string();
    }
    if let Some(a) = opt_str_arg(o.also_listen, "also_listen")? {
        c.also_listen = a
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
    }
    Ok(c)
}

/// The group's members: `*total` receives how many the registry lists,
/// `*alive` how many of them it heard from lately (either may be NULL).
#[no_mangle]
pub unsafe extern "C" fn strom_driver_members(
    driver: *const strom_driver,
    total: *mut u32,
    alive: *mut u32,
) -> strom_status {
    guard(|| {
        let members = driver_ref(driver)?.inner.members()?;
        let live = members.iter().filter(|m| m.alive).count();
        if !total.is_null() {
            *total = u32::try_from(members.len()).unwrap_or(u32::MAX);
        }
        if !alive.is_null() {
            *alive = u32::try_from(live).unwrap_or(u32::MAX);
        }
        Ok(())
    })
}

/// The registry master's address (`host:port`). Borrowed: valid until the
/// driver is freed.
#[no_mangle]
pub unsafe extern "C" fn strom_driver_master_addr(driver: *const strom_driver) -> *const c_char {
    match driver.as_ref() {
        Some(d) => d.master.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// Frees a driver (NULL is a no-op).
#[no_mangle]
pub unsafe extern "C" fn strom_driver_free(driver: *mut strom_driver) {
    if !driver.is_null() {
        guard(|| {
            drop(Box::from_raw(driver));
            Ok(())
        });
    }
}

pub(crate) unsafe fn driver_ref<'a>(d: *const strom_driver) -> FfiResult<&'a strom_driver> {
    d.as_ref().ok_or_else(|| Fail::null("driver"))
}

pub(crate) unsafe fn topic_ref<'a>(t: *const strom_topic) -> FfiResult<&'a strom_topic> {
    t.as_ref().ok_or_else(|| Fail::null("topic"))
}

fn new_topic(t: Topic, out: *mut *mut strom_topic) -> FfiResult {
    let name = CString::new(t.name()).unwrap_or_default();
    unsafe { put(out, Box::into_raw(Box::new(strom_topic { inner: t, name }))) };
    Ok(())
}

/// Creates a topic (`STROM_ERR_TOPIC_EXISTS` if it exists).
#[no_mangle]
pub unsafe extern "C" fn strom_topic_create(
    driver: *const strom_driver,
    spec: *const strom_topic_spec,
    out: *mut *mut strom_topic,
) -> strom_status {
    guard(|| {
        let d = driver_ref(driver)?;
        let spec = to_spec(spec.as_ref().ok_or_else(|| Fail::null("spec"))?)?;
        let out = out_arg(out, "out")?;
        new_topic(d.inner.create_topic(spec)?, out)
    })
}

/// Opens an existing topic (`STROM_ERR_TOPIC_NOT_FOUND` if there is none).
#[no_mangle]
pub unsafe extern "C" fn strom_topic_open(
    driver: *const strom_driver,
    name: *const c_char,
    out: *mut *mut strom_topic,
) -> strom_status {
    guard(|| {
        let d = driver_ref(driver)?;
        let name = str_arg(name, "name")?;
        let out = out_arg(out, "out")?;
        new_topic(d.inner.open_topic(name)?, out)
    })
}

/// Deletes a topic and its data.
#[no_mangle]
pub unsafe extern "C" fn strom_topic_delete(
    driver: *const strom_driver,
    name: *const c_char,
) -> strom_status {
    guard(|| {
        let d = driver_ref(driver)?;
        d.inner.delete_topic(str_arg(name, "name")?)?;
        Ok(())
    })
}

/// The topic's name. Borrowed: valid until the topic is freed.
#[no_mangle]
pub unsafe extern "C" fn strom_topic_name(topic: *const strom_topic) -> *const c_char {
    match topic.as_ref() {
        Some(t) => t.name.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// The topic's number of partitions (0 for NULL).
#[no_mangle]
pub unsafe extern "C" fn strom_topic_partitions(topic: *const strom_topic) -> u32 {
    topic.as_ref().map_or(0, |t| t.inner.partitions())
}

/// Ends the topic's stream explicitly, whatever producers are open:
/// consumers reach `STROM_END_OF_STREAM` after every event written before
/// this call, and later pushes fail with `STROM_ERR_TOPIC_CLOSED`. (The
/// stream also ends by itself once every producer has closed.)
#[no_mangle]
pub unsafe extern "C" fn strom_topic_complete(topic: *const strom_topic) -> strom_status {
    guard(|| Ok(topic_ref(topic)?.inner.complete()?))
}

/// Frees a topic handle (NULL is a no-op). The topic itself stays.
#[no_mangle]
pub unsafe extern "C" fn strom_topic_free(topic: *mut strom_topic) {
    if !topic.is_null() {
        guard(|| {
            drop(Box::from_raw(topic));
            Ok(())
        });
    }
}
