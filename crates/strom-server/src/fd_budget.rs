//! The file-descriptor budget: every listener's connection cap (native
//! `max_connections`, `kafka_max_connections` when `kafka_listen` is set,
//! `http_max_connections` when `http_listen` is set) plus `fd_reserve`
//! for storage, member links and the transform host must fit in the
//! process's RLIMIT_NOFILE. At startup the soft limit is raised toward the
//! hard one if that is needed; if the caps still do not fit, they are
//! lowered in proportion, with a warning naming every number, so that
//! connections can never take the descriptors storage needs. A limit too
//! low to leave any room is refused.

use crate::config::ServerConfig;

/// The fewest descriptors left for connections below which the server
/// refuses to start.
const MIN_CONNECTION_FDS: u64 = 16;

/// The caps counted in the budget, in the order native, Kafka, HTTP
/// (`None`: that listener is not configured).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    pub native: u32,
    pub kafka: Option<u32>,
    pub http: Option<u32>,
}

impl Caps {
    fn of(config: &ServerConfig) -> Caps {
        Caps {
            native: config.max_connections,
            kafka: config
                .kafka_listen
                .as_ref()
                .map(|_| config.kafka_max_connections),
            http: config
                .http_listen
                .as_ref()
                .map(|_| config.http_max_connections),
        }
    }

    fn total(&self) -> u64 {
        u64::from(self.native)
            + u64::from(self.kafka.unwrap_or(0))
            + u64::from(self.http.unwrap_or(0))
    }

    /// The caps scaled down to fit `room` descriptors (each at least 1).
    fn scaled(&self, room: u64) -> Caps {
        let total = self.total().max(1);
        let scale = |c: u32| ((u64::from(c) * room / total).max(1)).min(u64::from(c)) as u32;
        Caps {
            native: scale(self.native),
            kafka: self.kafka.map(scale),
            http: self.http.map(scale),
        }
    }
}

/// The caps that fit a descriptor `limit` with `reserve` kept free, or why
/// none do.
pub(crate) fn fit_caps(caps: Caps, limit: u64, reserve: u64) -> Result<Caps, String> {
    if caps.total() + reserve <= limit {
        return Ok(caps);
    }
    let room = limit.saturating_sub(reserve);
    if room < MIN_CONNECTION_FDS {
        return Err(format!(
            "the file-descriptor limit (RLIMIT_NOFILE) is {limit}: with fd_reserve = {reserve} kept for storage, fewer than {MIN_CONNECTION_FDS} are left for connections; raise `ulimit -n` or lower fd_reserve"
        ));
    }
    Ok(caps.scaled(room))
}

/// Raises the soft RLIMIT_NOFILE toward what the caps need (up to the hard
/// limit), then lowers the caps in `config` if they still do not fit.
pub(crate) fn apply(config: &mut ServerConfig) -> Result<(), String> {
    let caps = Caps::of(config);
    let reserve = u64::from(config.fd_reserve);
    let need = caps.total() + reserve;
    let Some((soft, hard)) = nofile() else {
        tracing::warn!("cannot read RLIMIT_NOFILE; the file-descriptor budget is not checked");
        return Ok(());
    };
    let mut limit = soft;
    if soft < need && hard > soft {
        let want = need.min(hard);
        if set_nofile(want, hard) {
            tracing::info!(
                from = soft,
                to = want,
                "raised the soft file-descriptor limit (RLIMIT_NOFILE)"
            );
            limit = want;
        }
    }
    let fitted = fit_caps(caps, limit, reserve)?;
    if fitted != caps {
        tracing::warn!(
            limit,
            fd_reserve = reserve,
            max_connections = fitted.native,
            kafka_max_connections = ?fitted.kafka,
            http_max_connections = ?fitted.http,
            asked = need,
            "file-descriptor budget: the connection caps do not fit RLIMIT_NOFILE; lowered them (raise `ulimit -n` to keep them)"
        );
        config.max_connections = fitted.native;
        if let Some(k) = fitted.kafka {
            config.kafka_max_connections = k;
        }
        if let Some(h) = fitted.http {
            config.http_max_connections = h;
        }
    } else {
        tracing::info!(
            limit,
            fd_reserve = reserve,
            max_connections = caps.native,
            kafka_max_connections = ?caps.kafka,
            http_max_connections = ?caps.http,
            "file-descriptor budget"
        );
    }
    Ok(())
}

// rlim_t is u64 on 64-bit Linux, not everywhere.
#[allow(clippy::unnecessary_cast)]
fn nofile() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes into the struct we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then_some((lim.rlim_cur as u64, lim.rlim_max as u64))
}

#[allow(clippy::unnecessary_cast)]
fn set_nofile(soft: u64, hard: u64) -> bool {
    let lim = libc::rlimit {
        rlim_cur: soft as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: setrlimit(2) reads the struct we own.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_that_fit_are_kept() {
        let caps = Caps {
            native: 100,
            kafka: Some(100),
            http: None,
        };
        assert_eq!(fit_caps(caps, 1024, 256), Ok(caps));
    }

    #[test]
    fn caps_past_the_limit_are_scaled_into_it() {
        let caps = Caps {
            native: 4096,
            kafka: Some(4096),
            http: Some(256),
        };
        let fitted = fit_caps(caps, 400, 256).unwrap();
        assert!(fitted.total() <= 144, "{fitted:?}");
        assert!(fitted.native > 50 && fitted.http >= Some(1), "{fitted:?}");
    }

    #[test]
    fn a_limit_with_no_room_is_refused() {
        let caps = Caps {
            native: 10,
            kafka: None,
            http: None,
        };
        let e = fit_caps(caps, 260, 256).unwrap_err();
        assert!(e.contains("ulimit -n") && e.contains("fd_reserve"), "{e}");
    }
}
