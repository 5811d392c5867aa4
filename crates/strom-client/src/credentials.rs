//! What a client proves itself with (docs/security.md): a Strom token,
//! from `STROM_TOKEN`, or from the file `STROM_TOKEN_FILE` names (a batch
//! job's token file, kept out of the process list and the environment).
//! Every connection the driver opens presents it once, right after
//! `Hello`. A same-node client over `shm://` needs none: the server knows
//! its uid from the kernel.

use crate::error::{Error, Result};

/// The environment variable holding a token.
pub const TOKEN_ENV: &str = "STROM_TOKEN";
/// The environment variable naming a file that holds a token.
pub const TOKEN_FILE_ENV: &str = "STROM_TOKEN_FILE";
/// A token file is at most this long (a token is at most 8 KiB).
const MAX_TOKEN_FILE: u64 = 16 << 10;

/// The token from the environment, if one is given.
pub fn token_from_env() -> Result<Option<String>> {
    if let Some(t) = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok(Some(t.trim().to_string()));
    }
    let Some(path) = std::env::var_os(TOKEN_FILE_ENV).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let bad = Error::InvalidArgument;
    let shown = std::path::Path::new(&path).display().to_string();
    let len = std::fs::metadata(&path)
        .map_err(|e| bad(format!("{TOKEN_FILE_ENV}={shown}: {e}")))?
        .len();
    if len > MAX_TOKEN_FILE {
        return Err(bad(format!(
            "{TOKEN_FILE_ENV}={shown} holds {len} bytes; a token file holds one token"
        )));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| bad(format!("{TOKEN_FILE_ENV}={shown}: {e}")))?;
    match text.trim() {
        "" => Err(bad(format!("{TOKEN_FILE_ENV}={shown} is empty"))),
        t => Ok(Some(t.to_string())),
    }
}
